"""The serving host's share of a saturated GPU, on the CPU: `openinfer serve` with a stand-in GPU.

The server is the real one (uvicorn, SSE, detokenizer, engine thread, scheduler, emulated decode graphs and
pipelining) on qwen3-tiny with dummy weights, but the model's forward is stubbed (token 7 for every sampled row)
and each step occupies a modelled device for as long as the step takes on an H100 (Qwen3-4B shape,
docs/reference figures: a decode graph of B rows 3.58 ms at 1, 5.91 at 32, 11.48 at 128, linear between and
beyond; a prefill token 15.5/1024 ms, added to a mixed step). Reading a step's tokens waits, GIL released, until
the modelled device has finished it, as a CUDA event wait does. So the host's work (HTTP, JSON, detokenizing,
the engine's bookkeeping) is on the critical path exactly where it would be on the GPU machine, and the output
tokens per second are the modelled device's figure times the share of it the host keeps busy.

`openinfer bench serve` drives it (600 prompts of 1024 random ids, 128 tokens out, unbounded rate) at each
--concurrency; per point it prints the failed requests, output tok/s, TTFT / TPOT p50, the engine steps, the share of
steps pipelined, the CPU time of the engine thread per step and of the event loop (the HTTP side) per output token,
and the bench client's CPU time per output token (on a machine of few cores the client competes with the server).
--profile writes the event loop's cProfile (the HTTP side: uvicorn, SSE, JSON, detokenizing) of the whole run, top
functions by own time, to stderr.

--engine-steps ROWS... times the engine thread's own work instead, in process and with no device model: the same
stubbed engine with ROWS requests of --input-len random ids running, then `Engine.step()` wall time, median, quartiles
and mean of --steps steps, in two kinds of step: decode (every row one token, pipelined as the server does) and mixed
(one running request, any of them, aborted and a new prompt of --input-len admitted before each step: ROWS - 1 decode
rows and the prompt's prefill in one eager step, what nearly every step is at a saturated 256 seats). The client's
reads are untimed, and the heap is frozen as the server freezes it. With --profile, the cProfile of each kind's steps
goes to stderr.
    python scripts/serve_host_profile.py [--concurrency 64 256] [--num-prompts 600] [--max-num-seqs 64] [--profile]
    python scripts/serve_host_profile.py --engine-steps 64 256 [--steps 400] [--profile]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

DECODE_MS = ((1, 3.58), (32, 5.91), (128, 11.48))   # H100, Qwen3-4B decode graph step by batch
PREFILL_MS_PER_TOKEN = 15.5 / 1024


def step_ms(decode_rows: int, prefill_tokens: int) -> float:
    """The modelled GPU time of a step (decode rows on a graph or in a mixed step, plus prefill tokens)."""
    (b0, t0), (b1, t1) = DECODE_MS[-2:] if decode_rows > DECODE_MS[1][0] else DECODE_MS[:2]
    decode = t0 + (t1 - t0) * (max(decode_rows, 1) - b0) / (b1 - b0) if decode_rows else 0.0
    return decode + prefill_tokens * PREFILL_MS_PER_TOKEN


class ModelledDevice:
    """One in-order queue of steps: a step starts when the previous one ends or when it is launched."""

    def __init__(self) -> None:
        self.free_at = time.perf_counter()
        self.done: dict[int, float] = {}
        self.steps = self.pipelined = 0

    def launch(self, launched, follows: bool) -> None:   # noqa: ANN001 — a model_runner.Launched
        h = launched.host
        lens = np.diff(h.query_start)
        decode, prefill = int((lens == 1).sum()), int(lens[lens > 1].sum())
        start = max(time.perf_counter(), self.free_at)
        self.free_at = start + step_ms(decode, prefill) / 1e3
        self.done[id(launched)] = self.free_at
        self.steps += 1
        self.pipelined += follows

    def wait(self, launched) -> None:   # noqa: ANN001
        left = self.done.pop(id(launched)) - time.perf_counter()
        if left > 0:
            time.sleep(left)


def thread_cpu(native_id: int) -> float:
    """CPU seconds (user + system) of one thread of this process."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stubbed_engine(max_num_seqs: int, pipelined: bool = True, kv_gib: float = 1.0):   # noqa: ANN201 — an Engine
    """qwen3-tiny with dummy weights, its forward stubbed (token 7 for every sampled row), emulated decode graphs."""
    from openinfer.engine.engine import EngineArgs, build_engine
    from openinfer.testing.graphs import emulate_graphs

    eng = build_engine("qwen3-tiny", EngineArgs(device="cpu", load_format="dummy", max_num_seqs=max_num_seqs,
                                                 max_model_len=2048, max_num_batched_tokens=8192,
                                                 kv_cache_memory_gib=kv_gib, pipelined_decode=pipelined))
    # logits of one column: the step's rows are selected from them (a mixed step's decode rows beside its prompt)
    eng.runner._forward = lambda batch: (np.zeros((len(batch.sample_rows), 1), np.float32),
                                         np.full(len(batch.sample_rows), 7, np.int64))
    emulate_graphs(eng)
    return eng


def serve(port: int, max_num_seqs: int, pipelined: bool, profile: bool) -> None:
    """The server process: the stubbed engine on the modelled device, served until killed; on SIGUSR1 it
    writes its counters as one JSON line to stdout (read by the driver after each point)."""
    import signal

    from openinfer.server.host import ModelHost
    from openinfer.server.run import serve as run_server

    eng = stubbed_engine(max_num_seqs, pipelined)
    runner, dev = eng.runner, ModelledDevice()
    execute, collect = runner.execute, runner.collect

    def timed_execute(step, sampling=None, prev=None):   # noqa: ANN001, ANN202
        launched = execute(step, sampling, prev)
        dev.launch(launched, step.follows)
        return launched

    def timed_collect(launched, logits_rows=()):   # noqa: ANN001, ANN202
        dev.wait(launched)
        return collect(launched, logits_rows)
    runner.execute, runner.collect = timed_execute, timed_collect
    loop_tid = threading.get_native_id()

    def report(*_: object) -> None:
        engine_tid = eng._thread.native_id
        print(json.dumps({"steps": dev.steps, "pipelined": dev.pipelined, "engine_cpu": thread_cpu(engine_tid),
                          "loop_cpu": thread_cpu(loop_tid), "tokens": eng.generation_tokens}),
              flush=True)
    signal.signal(signal.SIGUSR1, report)
    if not profile:
        run_server(ModelHost([eng]), "127.0.0.1", port, log_level="warning", log_stats=False)
        return
    import cProfile
    import pstats
    prof = cProfile.Profile()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # so the profile below is printed
    try:
        prof.runcall(run_server, ModelHost([eng]), "127.0.0.1", port, log_level="warning", log_stats=False)
    finally:
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)


def engine_steps(rows: int, input_len: int, steps: int, profile: bool) -> dict[str, list[float] | list[int]]:
    """Wall seconds of each timed Engine.step(), decode and mixed, at `rows` running requests (see the docstring),
    and each step's token count ("decode tokens", "mixed tokens")."""
    import asyncio
    import cProfile
    import gc
    import pstats

    from openinfer.sampling.sampler import SamplingParams

    loop = asyncio.new_event_loop()
    eng = stubbed_engine(rows, kv_gib=2.5)   # every request's lifetime of 2048 tokens, and more
    gc.collect()   # as the server does before it starts its engines (server/run.py)
    gc.freeze()
    rng = np.random.default_rng(rows)
    params = SamplingParams(max_tokens=2048 - input_len, temperature=0.0, ignore_eos=True)
    ids, tokens = [], []

    def submit() -> None:
        ids.append(eng.submit(rng.integers(0, 151000, input_len).tolist(), params).request_id)

    def run(n: int, before=None) -> list[float]:   # noqa: ANN001
        times = []
        for _ in range(n):
            if before is not None:
                before()
            t0 = time.perf_counter()
            stats = eng.step()
            times.append(time.perf_counter() - t0)
            tokens.append(stats.num_tokens)
            loop.call_soon(loop.stop)   # the client's reads, untimed: as the server's, a future a request
            loop.run_forever()
            for req in eng._requests.values():
                req.stream.drain()
                req.stream.wake_on(loop, loop.create_future())
        return times

    def swap() -> None:   # one request leaves (any of them, as outputs of many lengths end), a new prompt arrives
        eng.abort(ids.pop(int(rng.integers(len(ids)))))
        submit()

    for _ in range(rows):
        submit()
    sch = eng.scheduler
    run(1)   # takes the submitted requests in
    while sch.waiting or any(r.num_computed < r.num_tokens - 1 for r in sch.running):
        run(1)
    out = {}
    for kind, before in (("decode", None), ("mixed", swap)):
        run(10, before)   # warm
        prof = cProfile.Profile() if profile else None
        if prof is not None:
            prof.enable()
        del tokens[:]
        out[kind] = run(steps, before)
        out[kind + " tokens"] = tokens[:]
        if prof is not None:
            prof.disable()
            print(f"--- {rows} rows, {kind} steps", file=sys.stderr)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    eng.shutdown()
    loop.close()
    gc.unfreeze()
    return out


def counters(proc: subprocess.Popen) -> dict:
    import signal
    proc.send_signal(signal.SIGUSR1)
    return json.loads(proc.stdout.readline())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--num-prompts", type=int, default=600)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--no-pipelined-decode", action="store_true")
    ap.add_argument("--port", type=int, default=8791)
    ap.add_argument("--profile", action="store_true", help="cProfile the server's event loop")
    ap.add_argument("--engine-steps", type=int, nargs="+", metavar="ROWS",
                    help="time Engine.step() in process at these numbers of running rows instead")
    ap.add_argument("--steps", type=int, default=400, help="timed steps of each kind (--engine-steps)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.engine_steps:
        print(f"engine host ms per step, median [p25, p75] and mean of {a.steps}; {a.input_len} prompt ids a request")
        for rows in a.engine_steps:
            res = engine_steps(rows, a.input_len, a.steps, a.profile)
            for kind in ("decode", "mixed"):
                q = np.percentile(res[kind], [25, 50, 75]) * 1e3
                print(f"{rows:>4} rows {kind:>6}: {q[1]:7.3f} ms [{q[0]:.3f}, {q[2]:.3f}], "
                      f"mean {np.mean(res[kind]) * 1e3:.3f}, "
                      f"{np.mean(res[kind + ' tokens']):.0f} tokens a step", flush=True)
        return
    if a.serve:
        return serve(a.port, a.max_num_seqs, not a.no_pipelined_decode, a.profile)
    cmd = [sys.executable, __file__, "--serve", "--port", str(a.port), "--max-num-seqs", str(a.max_num_seqs)]
    cmd += ["--no-pipelined-decode"] * a.no_pipelined_decode + ["--profile"] * a.profile
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        print(f"max_num_seqs {a.max_num_seqs}, pipelined decode {'off' if a.no_pipelined_decode else 'on'}; "
              f"modelled device: decode {DECODE_MS} (batch, ms), prefill {PREFILL_MS_PER_TOKEN * 1e3:.1f} us/token")
        print(f"{'conc':>5} {'failed':>6} {'out tok/s':>9} {'of model':>8} {'TTFT p50':>9} {'TPOT p50':>9} "
              f"{'steps':>6} "
              f"{'piped':>6} {'engine ms/step':>14} {'loop us/token':>13} {'client us/token':>15}")
        for c in a.concurrency:
            out = Path(f"/tmp/serve-host-profile-{os.getpid()}-{c}.json")
            bench = [sys.executable, "-m", "openinfer", "bench", "serve", "--base-url", f"http://127.0.0.1:{a.port}",
                     "--model", "qwen3-tiny", "--num-prompts", str(a.num_prompts), "--input-len", str(a.input_len),
                     "--output-len", str(a.output_len), "--max-concurrency", str(c), "--vocab-size", "151000",
                     "--metric-percentiles", "50", "--disable-tqdm", "--seed", str(c), "--save-result",
                     "--result-dir", str(out.parent), "--result-filename", out.name, "--ready-check-timeout-sec", "120"]
            if c == a.concurrency[0]:   # first point: the ready check waits for the load; warm the path
                subprocess.run(bench[:bench.index("--num-prompts")] + ["--num-prompts", "8", "--disable-tqdm"],
                               check=True, capture_output=True)
            before, client = counters(proc), resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(bench, check=True, capture_output=True)
            after, client_after = counters(proc), resource.getrusage(resource.RUSAGE_CHILDREN)
            client_cpu = (client_after.ru_utime + client_after.ru_stime) - (client.ru_utime + client.ru_stime)
            r = json.loads(out.read_text())
            out.unlink()
            d = {k: after[k] - before[k] for k in after}
            ideal = modelled_throughput(c, a.max_num_seqs, a.num_prompts, a.input_len, a.output_len)
            print(f"{c:>5} {r['failed']:>6} {r['output_throughput']:>9.0f} {r['output_throughput'] / ideal:>8.0%} "
                  f"{r['median_ttft_ms']:>9.1f} {r['median_tpot_ms']:>9.2f} {d['steps']:>6} "
                  f"{d['pipelined'] / max(d['steps'], 1):>6.0%} {1e3 * d['engine_cpu'] / max(d['steps'], 1):>14.3f} "
                  f"{1e6 * d['loop_cpu'] / max(d['tokens'], 1):>13.1f} {1e6 * client_cpu / max(d['tokens'], 1):>15.1f}",
                  flush=True)
    finally:
        proc.terminate()
        proc.wait(10)


def modelled_throughput(concurrency: int, max_num_seqs: int, prompts: int, input_len: int, output_len: int) -> float:
    """Output tok/s of the modelled device alone, the host taking no time: waves of min(concurrency, max_num_seqs)
    requests, each a prefill then output_len decode steps (what the scheduler does when all arrive together)."""
    b = min(concurrency, max_num_seqs)
    waves = prompts / b
    seconds = waves * (b * input_len * PREFILL_MS_PER_TOKEN + output_len * step_ms(b, 0)) / 1e3
    return prompts * output_len / seconds


if __name__ == "__main__":
    main()
