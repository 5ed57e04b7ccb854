"""One engine step under Nsight Compute: every kernel's GPU time, summed by kernel (GPU only).

Builds a preset with dummy weights, brings the scenario to steady state, then runs exactly one step between two
empty marker kernels that scripts/ncu_table.py cuts the log at. Run it under ncu (scripts/gpu_ncu.sh does):
    ncu --graph-profiling node --metrics gpu__time_duration.sum --csv \
        python scripts/gpu_kernel_times.py qwen3-4b decode 1
Scenarios: `decode B` (one graph-replayed decode step, B rows at --context tokens each),
`eager B` (the same step eagerly), `prefill N` (one cold prefill of an N-token prompt; with --prompts K, of K such
prompts in one step, as a saturated server runs them). --kv-cache-dtype fp8 profiles the step over an fp8 KV cache.
"""
from __future__ import annotations

import argparse

import numpy as np

from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.engine.engine_args import add_kv_cache_dtype_option
from openinfer.sampling.sampler import SamplingParams

NVTX_RANGE = "openinfer_step"   # gpu_ncu.sh's --nvtx-include


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="a preset, e.g. qwen3-4b or qwen3.5-4b")
    ap.add_argument("scenario", choices=("decode", "eager", "prefill"))
    ap.add_argument("size", type=int, help="batch rows (decode/eager) or prompt tokens (prefill)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--device", default="cuda", help="cpu only to check this script without a GPU")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder, for a preset of a line that ships none")
    ap.add_argument("--prompts", type=int, default=1, help="prefill: prompts of `size` tokens in the one step")
    add_kv_cache_dtype_option(ap)
    a = ap.parse_args()
    rows = a.size if a.scenario != "prefill" else a.prompts
    eng = build_engine(a.model, EngineArgs(device=a.device, load_format="dummy", tokenizer=a.tokenizer,
                                           max_num_seqs=max(rows, 8), max_model_len=max(4 * a.context, 2 * a.size),
                                           max_num_batched_tokens=max(8192, a.size * a.prompts),
                                           enforce_eager=a.scenario == "eager", kv_cache_dtype=a.kv_cache_dtype))
    rng = np.random.default_rng(0)
    vocab = min(150000, eng.vocab_size)   # token ids any of the lines' vocabularies holds
    params = SamplingParams(max_tokens=a.context, temperature=0.0, ignore_eos=True)
    if a.scenario == "prefill":
        warm = [eng.submit(rng.integers(0, vocab, a.size).tolist(), params) for _ in range(a.prompts)]
        eng.step()   # the same shapes once, unprofiled
        for w in warm:
            eng.abort(w.request_id)
        eng.step()
        for _ in range(a.prompts):
            eng.submit(rng.integers(0, vocab, a.size).tolist(), params)
    else:
        for _ in range(rows):
            eng.submit(rng.integers(0, vocab, a.context).tolist(), params)
        eng._drain()   # submitted requests reach the scheduler here
        while eng.scheduler.waiting or any(r.num_computed < r.num_tokens - 1 for r in eng.scheduler.running):
            eng.step()
        for _ in range(3):
            eng.step()
    if a.device == "cpu":
        check(eng.step(), a)
        return
    import cupy as cp

    # these two one-thread kernels bracket the step for ncu_table.py, inside an NVTX range (NVTX_RANGE) that ncu's
    # --nvtx-include can keep to (a cudaProfilerStart/Stop range caught no graph-replayed kernels on the H200)
    marker = cp.RawModule(code='extern "C" __global__ void openinfer_step_begin() {}\n'
                               'extern "C" __global__ void openinfer_step_end() {}')
    stream = eng.runner.backend.stream
    cp.cuda.nvtx.RangePush(NVTX_RANGE)
    marker.get_function("openinfer_step_begin")((1,), (1,), (), stream=stream)
    stats = eng.step()
    marker.get_function("openinfer_step_end")((1,), (1,), (), stream=stream)
    stream.synchronize()
    cp.cuda.nvtx.RangePop()
    check(stats, a)   # a prefill's one step ends with its first token (no cut at the last full block)


def check(stats, a: argparse.Namespace) -> None:
    """The profiled step must be the scenario's (a rejected or finished request leaves an empty step)."""
    rows, tokens = (a.prompts, a.size * a.prompts) if a.scenario == "prefill" else (a.size, a.size)
    if stats.num_seqs != rows or stats.num_tokens != tokens:   # (the budget holds the whole prompt)
        raise SystemExit(f"the profiled step ran {stats.num_seqs} rows and {stats.num_tokens} tokens, "
                         f"not {rows} and {tokens}")
    print(f"profiled step: {stats.num_seqs} rows, {stats.num_tokens} tokens, {1e3 * stats.seconds:.2f} ms wall")


if __name__ == "__main__":
    main()
