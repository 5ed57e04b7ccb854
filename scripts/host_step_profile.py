"""The engine's own host time per decode step, on the CPU: what a GPU step adds on top of its graph replay.

Builds qwen3-tiny with dummy weights on the numpy backend, brings `batch` greedy ignore_eos requests to
steady decode, then swaps the model forward for one that returns fixed tokens, so a timed `eng.step()`
is the engine's bookkeeping alone: drain, schedule, block allocation, host batch + upload, readback,
advance (commit, output ids, stream events, stop checks). The steps cross block boundaries as a long
run does (one in block_size steps per row). --forward also times the real numpy forward for comparison.
--first also times the first decode step after a fresh batch's prefill against the step after it (the
step that would pay for any per-request work done once when a request enters decode).
--prefix-hit N... times a full-prompt prefix hit instead (submit -> first token, forward stubbed) of an N-token
prompt just finished, as scripts/gpu_prefix_hit.py does on a GPU (qwen3-tiny with its context raised to fit),
after gc.freeze(), counting the collector's runs.
--graphs decodes through emulated CUDA graphs (the graph path's host work, staging included); --pipelined
with --pipelined-decode too, whose host work per step runs while the GPU computes the next step (it is
hidden where it is shorter than a step's graph time). It cannot show the overlap itself: nothing runs
beside the host here.
--opcodes also counts the Python bytecodes of a step (of a hit): a count that holds still where the times
of a shared machine vary by tens of percent between processes (work in C is not in it).
    python scripts/host_step_profile.py [--batch 32 128] [--steps 256] [--context 512] [--drain] [--first]
                                        [--profile] [--opcodes] [--prefix-hit 1024 16384]
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from openinfer.engine import Engine, EngineArgs, build_engine
from openinfer.plugins import get_plugins
from openinfer.request import RequestStream, Tokens
from openinfer.sampling import SamplingParams
from openinfer.testing.graphs import emulate_graphs


def decoding_engine(batch: int, context: int, steps: int, stub: bool) -> tuple[Engine, list[RequestStream]]:
    """`batch` requests of `context` prompt tokens each, every one past its prefill, and their streams;
    `stub`: the forward is stubbed from the start (the prefill takes no time)."""
    eng = build_engine("qwen3-tiny", EngineArgs(device="cpu", load_format="dummy", max_num_seqs=batch,
                                                 max_model_len=context + steps + 64,
                                                 max_num_batched_tokens=max(8192, context)))
    if stub:
        stub_forward(eng)
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


def first_steps(batch: int, context: int, rounds: int, profile: bool) -> np.ndarray:
    """[rounds, 2]: thread CPU seconds of the first decode step after a fresh batch's prefill and of
    the step after it, one engine (forward stubbed throughout) running `rounds` batches in turn as
    bench latency does (64 tokens each: none ends during the chunked prefill of the others);
    `profile`: cProfile the first decode step of one more round."""
    eng = build_engine("qwen3-tiny", EngineArgs(device="cpu", load_format="dummy", max_num_seqs=batch,
                                                 max_model_len=context + 64, max_num_batched_tokens=8192))
    stub_forward(eng)
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    out, prof = np.zeros((rounds, 2)), cProfile.Profile()
    for k in range(rounds + profile):
        streams = [eng.submit(rng.integers(0, eng.vocab_size, context).tolist(), params) for _ in range(batch)]
        eng.step()
        while eng.scheduler.waiting or any(not r.output_ids for r in eng.scheduler.running):
            eng.step()
        for j in range(2):
            c0 = time.thread_time()
            stats = prof.runcall(eng.step) if k == rounds and j == 0 else eng.step()
            if stats.num_tokens != batch:
                raise SystemExit(f"a decode step ran {stats.num_tokens} tokens, not {batch}")
            if k < rounds:
                out[k, j] = time.thread_time() - c0
        while eng.has_unfinished():
            eng.step()
        for s in streams:
            s.drain()
    if profile:
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return out


def long_tiny(max_len: int) -> str:
    """A checkpoint folder (config + tokenizer, no weights) of qwen3-tiny with `max_len` positions."""
    line = next(l for l in get_plugins().lines.values() if "qwen3-tiny" in l.presets)
    out = Path(tempfile.mkdtemp(prefix="qwen3-tiny-long-"))
    (out / "config.json").write_text(json.dumps({**line.presets["qwen3-tiny"], "max_position_embeddings": max_len}))
    for f in Path(line.tokenizer_dir()).iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    return str(out)


def opcodes(fn: Callable[[], object]) -> int:
    """The Python bytecodes executed by fn()."""
    count = 0

    def trace(frame, event, arg):   # noqa: ANN001, ANN202 — sys.settrace's signature
        nonlocal count
        frame.f_trace_opcodes = True
        count += event == "opcode"
        return trace

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def prefix_hits(lengths: list[int], repeats: int, profile: bool, count_ops: bool) -> None:
    """Per length: wall and thread CPU ms of submit -> first token of a full-prompt hit (the prompt
    prefilled and finished just before), and the collector's runs during the hits; `profile`: cProfile
    of the longest length's hits; `count_ops`: the bytecodes of one more hit."""
    eng = build_engine(long_tiny(max(lengths) + 64), EngineArgs(
        device="cpu", load_format="dummy", max_num_seqs=8, max_model_len=max(lengths) + 64,
        max_num_batched_tokens=max(lengths), kv_cache_memory_gib=0.25))
    stub_forward(eng)
    for parts in eng.runner.pools.paged.values():   # the pool's pages touched now, not by the timed block copies
        for arr in parts.values():
            arr.fill(0)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    rng, runs, prof = np.random.default_rng(0), [0], cProfile.Profile()
    gc.callbacks.append(lambda phase, info: runs.__setitem__(0, runs[0] + (phase == "start")))

    def first_token(ids: list[int], profiled: bool = False) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.thread_time()
        if profiled:
            prof.enable()
        stream = eng.submit(ids, params)
        while not any(isinstance(ev, Tokens) for ev in stream.drain()):
            if not eng.has_unfinished():
                raise SystemExit(f"a {len(ids)}-token prompt got no token")
            eng.step()
        if profiled:
            prof.disable()
        return time.perf_counter() - t0, time.thread_time() - c0

    def finish() -> None:
        while eng.has_unfinished():
            eng.step()

    for n in lengths:
        for _ in range(2):   # warm: a cold run and a hit, twice
            ids = rng.integers(0, eng.vocab_size, n).tolist()
            for _ in range(2):
                first_token(ids)
                finish()
    gc.collect()
    gc.freeze()
    for n in lengths:
        got, collections = [], 0
        for k in range(repeats):
            ids = rng.integers(0, eng.vocab_size, n).tolist()
            first_token(ids)   # cold: prefill, finish
            finish()
            runs[0] = 0
            got.append(first_token(ids, profile and n == max(lengths)))
            collections += runs[0]
            finish()
        (wall, cpu), (wall99, cpu99) = 1e3 * np.median(got, 0), 1e3 * np.percentile(got, 99, 0)
        print(f"prefix hit {n:6d} tokens: submit -> first token ms  CPU p50 {cpu:.3f} p99 {cpu99:.3f}  "
              f"wall p50 {wall:.3f} p99 {wall99:.3f}  gc runs {collections} in {repeats} hits")
        if count_ops:
            first_token(ids)
            finish()
            print(f"prefix hit {n:6d} tokens: {opcodes(lambda: first_token(ids))} bytecodes submit -> first token")
            finish()
    if profile:
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


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
                    help="read the events after each step (a server, bench latency); default: they pile up")
    ap.add_argument("--forward", action="store_true", help="also time steps with the real numpy forward")
    ap.add_argument("--first", action="store_true",
                    help="also time the first decode step after a fresh batch's prefill, against the next one")
    ap.add_argument("--graphs", action="store_true",
                    help="decode through emulated graphs (testing/graphs.py): a CUDA step's staging of the inputs")
    ap.add_argument("--pipelined", action="store_true",
                    help="--graphs with --pipelined-decode: the host work that step N+1 on the GPU hides")
    ap.add_argument("--profile", action="store_true", help="cProfile one more run, top functions")
    ap.add_argument("--opcodes", action="store_true", help="also count the Python bytecodes of a step (a hit)")
    ap.add_argument("--prefix-hit", type=int, nargs="+", metavar="N",
                    help="time full-prompt prefix hits of N-token prompts instead (--repeats hits each)")
    a = ap.parse_args()
    if a.prefix_hit:
        return prefix_hits(a.prefix_hit, a.repeats, a.profile, a.opcodes)
    for batch in a.batch:
        if a.first:
            first, second = 1e3 * np.median(first_steps(batch, a.context, 2 * a.repeats + 1, a.profile), 0)
            print(f"batch {batch:4d}: host CPU ms, first decode step after prefill {first:.3f}, "
                  f"the next step {second:.3f} (medians of {2 * a.repeats + 1} batches)")
        eng, streams = decoding_engine(batch, a.context, (a.repeats + 1) * a.steps + 16, not a.forward)
        drain = streams if a.drain else []
        if a.forward:
            ms = 1e3 * time_steps(eng, 8, batch, drain)[:, 0].mean()
            print(f"batch {batch:4d}: {ms:8.3f} ms/step with the numpy forward")
        stub_forward(eng)
        if a.graphs or a.pipelined:
            emulate_graphs(eng)   # replays the stub
            eng.args.pipelined_decode = a.pipelined
        time_steps(eng, 8, batch, drain)   # warm
        best = min((time_steps(eng, a.steps, batch, drain) for _ in range(a.repeats)), key=lambda t: t[:, 1].mean())
        (wall, cpu), (wall_med, cpu_med) = 1e3 * best.mean(0), 1e3 * np.median(best, 0)
        print(f"batch {batch:4d}: host ms/step  CPU mean {cpu:.3f} median {cpu_med:.3f}  "
              f"wall mean {wall:.3f} median {wall_med:.3f}  ({1e3 * cpu / batch:.2f} us/row CPU)")
        if a.opcodes:
            ops = []
            for _ in range(8):
                ops.append(opcodes(eng.step))
                for s in drain:
                    s.drain()
            print(f"batch {batch:4d}: {int(np.median(ops))} bytecodes/step (median of 8)")
        if a.profile:
            prof = cProfile.Profile()
            prof.enable()
            time_steps(eng, a.steps, batch, drain)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
