"""The engine's own host time per decode step, on the CPU: what a GPU step adds on top of its graph replay.

Builds qwen3-tiny with dummy weights on the numpy backend, brings `batch` greedy ignore_eos requests to
steady decode, then swaps the model forward for one that returns fixed tokens, so a timed `eng.step()`
is the engine's bookkeeping alone: drain, schedule, block allocation, host batch + upload, readback,
advance (commit, output ids, stream events, stop checks). The steps cross block boundaries as a long
run does (one in block_size steps per row). --forward also times the real numpy forward for comparison.
    python scripts/host_step_profile.py [--batch 32 128] [--steps 256] [--context 512] [--drain] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

from openinfer.engine import Engine, EngineArgs, build_engine
from openinfer.request import RequestStream
from openinfer.sampling import SamplingParams


def decoding_engine(batch: int, context: int, steps: int) -> tuple[Engine, list[RequestStream]]:
    """`batch` requests of `context` prompt tokens each, every one past its prefill, and their streams."""
    eng = build_engine("qwen3-tiny", EngineArgs(device="cpu", load_format="dummy", max_num_seqs=batch,
                                                 max_model_len=context + steps + 64,
                                                 max_num_batched_tokens=max(8192, context)))
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=steps + 32, temperature=0.0, ignore_eos=True)
    streams = [eng.submit(rng.integers(0, eng.vocab_size, context).tolist(), params) for _ in range(batch)]
    eng.step()
    while eng.scheduler.waiting or any(not r.output_ids for r in eng.scheduler.running):
        eng.step()
    return eng, streams


def stub_forward(eng: Engine) -> None:
    """The model's forward returns token 7 for every sampled row: only host work is left."""
    eng.runner._forward = lambda batch: (None, np.full(len(batch.sample_rows), 7, np.int64))


def time_steps(eng: Engine, steps: int, batch: int, drain: list[RequestStream]) -> np.ndarray:
    """[steps, 2]: wall and thread CPU seconds of each step, each running every request (the CPU time
    holds still on a machine shared with other work); the `drain` streams are read after each step,
    outside its time, as a server's readers do."""
    out = np.zeros((steps, 2))
    for i in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        stats = eng.step()
        out[i] = time.perf_counter() - t0, time.thread_time() - c0
        if stats.num_seqs != batch or stats.num_tokens != batch:
            raise SystemExit(f"a step ran {stats.num_seqs} rows and {stats.num_tokens} tokens, not {batch}")
        for s in drain:
            s.drain()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--steps", type=int, default=256, help="timed decode steps per run")
    ap.add_argument("--context", type=int, default=512, help="prompt tokens per request")
    ap.add_argument("--repeats", type=int, default=3, help="runs per batch size; the lowest mean CPU is printed")
    ap.add_argument("--drain", action="store_true",
                    help="read the events after each step (a server); default: they pile up, as in bench latency")
    ap.add_argument("--forward", action="store_true", help="also time steps with the real numpy forward")
    ap.add_argument("--profile", action="store_true", help="cProfile one more run, top functions")
    a = ap.parse_args()
    for batch in a.batch:
        eng, streams = decoding_engine(batch, a.context, (a.repeats + 1) * a.steps + 16)
        drain = streams if a.drain else []
        if a.forward:
            ms = 1e3 * time_steps(eng, 8, batch, drain)[:, 0].mean()
            print(f"batch {batch:4d}: {ms:8.3f} ms/step with the numpy forward")
        stub_forward(eng)
        time_steps(eng, 8, batch, drain)   # warm
        best = min((time_steps(eng, a.steps, batch, drain) for _ in range(a.repeats)), key=lambda t: t[:, 1].mean())
        (wall, cpu), (wall_med, cpu_med) = 1e3 * best.mean(0), 1e3 * np.median(best, 0)
        print(f"batch {batch:4d}: host ms/step  CPU mean {cpu:.3f} median {cpu_med:.3f}  "
              f"wall mean {wall:.3f} median {wall_med:.3f}  ({1e3 * cpu / batch:.2f} us/row CPU)")
        if a.profile:
            prof = cProfile.Profile()
            prof.enable()
            time_steps(eng, a.steps, batch, drain)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
