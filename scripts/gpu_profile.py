"""Where a decode step's time goes on the GPU (Qwen3-4B shape, dummy weights, 1k context).

For each batch size: the engine step's wall time, the host-side preparation alone, the captured
graph's GPU time (CUDA events around a replay) and the eager forward's GPU and wall time.
    python scripts/gpu_profile.py MODEL_DIR [--batch-sizes 1,32,128] [--context 1024]
"""
from __future__ import annotations

import argparse
import time

import cupy as cp
import numpy as np

from openinfer.engine import EngineArgs, build_engine
from openinfer.sampling import SamplingParams


def median_ms(fn, n: int = 20) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def gpu_ms(fn, stream, n: int = 20) -> float:
    start, end = cp.cuda.Event(), cp.cuda.Event()
    fn()
    start.record(stream)
    for _ in range(n):
        fn()
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch-sizes", default="1,32,128")
    ap.add_argument("--context", type=int, default=1024)
    a = ap.parse_args()
    sizes = [int(b) for b in a.batch_sizes.split(",")]
    eng = build_engine(a.model, EngineArgs(device="cuda", load_format="dummy", max_num_seqs=max(sizes),
                                           max_model_len=4 * a.context, max_num_batched_tokens=8192))
    runner, stream = eng.runner, eng.runner.backend.stream
    rng = np.random.default_rng(0)
    print(f"{'batch':>5} {'step wall':>10} {'prepare':>8} {'graph gpu':>10} {'eager gpu':>10} {'eager wall':>11}  (ms)")
    for B in sizes:
        params = SamplingParams(max_tokens=2 * a.context, temperature=0.0, ignore_eos=True)
        streams = [eng.submit(rng.integers(0, 150000, a.context).tolist(), params) for _ in range(B)]
        while any(r.num_computed < r.num_tokens - 1 for r in eng.scheduler.running) or eng.scheduler.waiting \
                or len(eng.scheduler.running) < B:
            eng.step()
        step = median_ms(eng.step)
        plan = eng.scheduler.schedule()
        h = runner.prepare_host(plan)
        prepare = median_ms(lambda: runner.prepare_host(plan))
        graph = gpu_ms(lambda: runner.graphs.replay(h), stream)
        batch = runner.upload(h)
        eager_gpu = gpu_ms(lambda: runner._forward(batch), stream, 5)
        eager_wall = median_ms(lambda: (runner._forward(batch), stream.synchronize()), 5)
        print(f"{B:>5} {step:>10.2f} {prepare:>8.2f} {graph:>10.2f} {eager_gpu:>10.2f} {eager_wall:>11.2f}")
        for s in streams:
            eng.abort(s.request_id)
        eng.step()


if __name__ == "__main__":
    main()
