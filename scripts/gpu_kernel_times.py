"""One engine step under Nsight Compute: every kernel's GPU time, summed by kernel (GPU only).

Builds a preset with dummy weights, brings the scenario to steady state outside the profiled range, then profiles
exactly one step between cudaProfilerStart/Stop. Run it under ncu (scripts/gpu_ncu.sh does):
    ncu --profile-from-start off --graph-profiling node --metrics gpu__time_duration.sum --csv \
        python scripts/gpu_kernel_times.py qwen3-4b decode 1
Scenarios: `decode B` (one graph-replayed decode step, B rows at --context tokens each),
`eager B` (the same step eagerly), `prefill N` (one cold prefill of an N-token prompt).
"""
from __future__ import annotations

import argparse

import numpy as np

from openinfer.engine import EngineArgs, build_engine
from openinfer.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="a preset, e.g. qwen3-4b or qwen3.5-4b")
    ap.add_argument("scenario", choices=("decode", "eager", "prefill"))
    ap.add_argument("size", type=int, help="batch rows (decode/eager) or prompt tokens (prefill)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--device", default="cuda", help="cpu only to check this script without a GPU")
    a = ap.parse_args()
    rows = a.size if a.scenario != "prefill" else 1
    eng = build_engine(a.model, EngineArgs(device=a.device, load_format="dummy", max_num_seqs=max(rows, 8),
                                           max_model_len=max(4 * a.context, 2 * a.size),
                                           max_num_batched_tokens=max(8192, a.size),
                                           enforce_eager=a.scenario == "eager"))
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=4 * a.context, temperature=0.0, ignore_eos=True)
    if a.scenario == "prefill":
        warm = eng.submit(rng.integers(0, 150000, a.size).tolist(), params)   # the same shape once, unprofiled
        eng.step()
        eng.abort(warm.request_id)
        eng.step()
        eng.submit(rng.integers(0, 150000, a.size).tolist(), params)
    else:
        for _ in range(rows):
            eng.submit(rng.integers(0, 150000, a.context).tolist(), params)
        while eng.scheduler.waiting or any(r.num_computed < r.num_tokens - 1 for r in eng.scheduler.running):
            eng.step()
        for _ in range(3):
            eng.step()
    if a.device == "cpu":
        eng.step()
        return
    import cupy as cp

    stream = eng.runner.backend.stream
    stream.synchronize()
    cp.cuda.profiler.start()
    eng.step()
    stream.synchronize()
    cp.cuda.profiler.stop()


if __name__ == "__main__":
    main()
