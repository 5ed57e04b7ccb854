"""What each kernel family costs inside a decode graph (GPU only): the graph recaptured with that family's launches
dropped, its replay time against the full graph's. The outputs are garbage without them; only the time is read.

Nsight Compute times each kernel alone, with cold caches and no neighbours (scripts/gpu_ncu.sh). This measures the
marginal cost of a family where it runs: between its neighbours, in the graph, with PDL. "all but gemv" keeps the
GEMVs alone (the weight stream); "gemv" drops them (what everything else costs).

    python scripts/gpu_ablation.py qwen3-4b [--batch 1] [--context 1024] [--families gemv,paged_decode,...]
    python scripts/gpu_ablation.py deepseek-v2-lite --tokenizer plugins/qwen3/openinfer_qwen3/demo_tokenizer \
        --families "$(python scripts/gpu_ablation.py --mla-moe-families)"
"""
from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import Iterator

import cupy as cp
import numpy as np

from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.kernels.cuda import module
from openinfer.sampling.sampler import SamplingParams

FAMILIES = ("gemv", "paged_decode", "rope", "add_rms_norm", "rms_norm", "conv_update", "gdn_gating", "gdn_decode",
            "gated_rms_norm", "sigmoid_gate", "gather_rows", "argmax", "all but gemv")
# The MLA + MoE lines' kernels. On these lines a dropped kernel's garbage reaches the routers after it, and the
# experts they pick (a NaN top-k collapses onto few) set what the step reads: a row is a bound, not a cost, unless
# the expert GEMMs' own rows stay near their Nsight Compute times. The router and the grouping come last: without
# them the expert GEMMs read routes and tile lists the step never wrote, which may name no expert at all.
MLA_MOE_FAMILIES = ("gemv_heads", "gemv_silu", "gemv", "mla_attention", "mla_rope_write", "add_rms_norm",
                    "moe_gate_up", "moe_down", "moe_combine", "all but gemv", "moe_router", "moe_align")


@contextmanager
def dropping(family: str, counts: dict[str, int]) -> Iterator[None]:
    """Launches whose kernel name starts with `family` (or, for "all but gemv", every other one) are skipped and
    counted, in every loaded module that launches through openinfer.kernels.cuda.module.launch."""
    real = module.launch

    def launch(source, name, *args, **kwargs):
        drop = not name.startswith("gemv") if family == "all but gemv" else name.startswith(family)
        if drop:
            counts[name] = counts.get(name, 0) + 1
            return
        real(source, name, *args, **kwargs)
    users = [m for m in list(sys.modules.values()) if getattr(m, "launch", None) is real]
    for m in users:
        m.launch = launch
    try:
        yield
    finally:
        for m in users:
            m.launch = real


def replay_ms(graphs, h, stream, n: int = 50) -> float:
    start, end = cp.cuda.Event(), cp.cuda.Event()
    graphs.replay(h)
    start.record(stream)
    for _ in range(n):
        graphs.replay(h)
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / n


def main() -> None:
    if sys.argv[1:] == ["--mla-moe-families"]:
        print(",".join(MLA_MOE_FAMILIES))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="a preset, e.g. qwen3-4b or qwen3.5-4b")
    ap.add_argument("--tokenizer", help="a tokenizer folder, for a line that ships none (deepseek-v2-lite)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--families", default=",".join(FAMILIES))
    a = ap.parse_args()
    eng = build_engine(a.model, EngineArgs(device="cuda", load_format="dummy", max_num_seqs=a.batch,
                                           tokenizer=a.tokenizer,
                                           max_model_len=4 * a.context, gpu_memory_utilization=0.5,
                                           pipelined_decode=False))   # no step left in flight to schedule around
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=2 * a.context, temperature=0.0, ignore_eos=True)
    for _ in range(a.batch):
        eng.submit(rng.integers(0, min(150000, eng.vocab_size), a.context).tolist(), params)
    # submit() only queues; the step loop admits. Step until every prompt is prefilled and has its first token.
    while len(eng.scheduler.running) < a.batch or any(r.num_computed < r.num_tokens - 1 for r in eng.scheduler.running):
        eng.step()
    runner, backend = eng.runner, eng.runner.backend
    plan = eng.scheduler.schedule()
    assert len(plan.runs) == a.batch, f"expected {a.batch} decode rows, the scheduler gave {len(plan.runs)}"
    h = runner.prepare_host(plan)
    full = replay_ms(runner.graphs, h, backend.stream)
    print(f"{a.model}, batch {a.batch}, {a.context} context: full graph {full:.3f} ms")
    print(f"{'dropped':<16} {'launches':>8} {'graph ms':>9} {'cost ms':>8} {'us each':>8}")
    for family in a.families.split(","):
        counts: dict[str, int] = {}
        with dropping(family, counts), backend.device:
            runner.graphs.capture()   # the largest bucket runs once eagerly, then each bucket is captured
        launches = sum(counts.values()) // (len(runner.graphs.sizes) + 1)   # per step: every capture and the eager run
        if not launches:
            continue
        t = replay_ms(runner.graphs, h, backend.stream)
        print(f"{family:<16} {launches:>8} {t:9.3f} {full - t:8.3f} {1e3 * (full - t) / launches:8.2f}")
    with backend.device:
        runner.graphs.capture()


if __name__ == "__main__":
    main()
