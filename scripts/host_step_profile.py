"""The engine's own host time per decode step, on the CPU: what a GPU step adds on top of its graph replay.

Builds qwen3-tiny with dummy weights on the numpy backend, brings `batch` greedy ignore_eos requests to
steady decode, then swaps the model forward for one that returns fixed tokens, so a timed `eng.step()`
is the engine's bookkeeping alone: drain, schedule, block allocation, host batch + upload, readback,
advance (commit, output ids, stream events, stop checks). The steps cross block boundaries as a long
run does (one in block_size steps per row). --forward also times the real numpy forward for comparison.
    python scripts/host_step_profile.py [--batch 32 128] [--steps 256] [--context 512] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

from openinfer.engine import Engine, EngineArgs, build_engine
from openinfer.sampling import SamplingParams


def decoding_engine(batch: int, context: int, steps: int) -> Engine:
    """`batch` requests of `context` prompt tokens each, every one past its prefill."""
    eng = build_engine("qwen3-tiny", EngineArgs(device="cpu", load_format="dummy", max_num_seqs=batch,
                                                 max_model_len=context + steps + 64,
                                                 max_num_batched_tokens=max(8192, context)))
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=steps + 32, temperature=0.0, ignore_eos=True)
    for _ in range(batch):
        eng.submit(rng.integers(0, eng.vocab_size, context).tolist(), params)
    eng.step()
    while eng.scheduler.waiting or any(not r.output_ids for r in eng.scheduler.running):
        eng.step()
    return eng


def stub_forward(eng: Engine) -> None:
    """The model's forward returns token 7 for every sampled row: only host work is left."""
    eng.runner._forward = lambda batch: (None, np.full(len(batch.sample_rows), 7, np.int64))


def time_steps(eng: Engine, steps: int, batch: int) -> float:
    """Mean ms per step over `steps` steps, each running every request."""
    t0 = time.perf_counter()
    for _ in range(steps):
        stats = eng.step()
        if stats.num_seqs != batch or stats.num_tokens != batch:
            raise SystemExit(f"a step ran {stats.num_seqs} rows and {stats.num_tokens} tokens, not {batch}")
    return 1e3 * (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--steps", type=int, default=256, help="timed decode steps per batch size")
    ap.add_argument("--context", type=int, default=512, help="prompt tokens per request")
    ap.add_argument("--repeats", type=int, default=3, help="the best of this many timed runs is printed")
    ap.add_argument("--forward", action="store_true", help="also time steps with the real numpy forward")
    ap.add_argument("--profile", action="store_true", help="cProfile the stubbed steps, top functions")
    a = ap.parse_args()
    for batch in a.batch:
        eng = decoding_engine(batch, a.context, (a.repeats + 1) * a.steps + 16)
        if a.forward:
            print(f"batch {batch:4d}: {time_steps(eng, 8, batch):8.3f} ms/step with the numpy forward")
        stub_forward(eng)
        time_steps(eng, 8, batch)   # warm
        best = min(time_steps(eng, a.steps, batch) for _ in range(a.repeats))
        print(f"batch {batch:4d}: {best:8.3f} ms/step host ({1e3 * best / batch:.2f} us/row)")
        if a.profile:
            prof = cProfile.Profile()
            prof.enable()
            time_steps(eng, a.steps, batch)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
