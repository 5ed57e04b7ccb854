"""The KV offload tier around a device prefix hit, at the block counts of the H200 run, on the CPU.

The scheduler, block manager and host tier run for real; the model and the GPU do not. A step
advances num_computed, commits and samples token 0, as Engine.step does; the copier keeps a
virtual clock instead of copying. Two things come out per rung of `openinfer bench prefix
--host-restore`'s ladder (a ready prompt, then per repeat: cold, device hit, fillers of the pool
plus one prompt sent together, host restore):
- host ms: wall time of the tier's Python per step (schedule = admission + allocation, advance =
  commit + release, after_step = top_up), and of the step that sampled the token;
- model ms: the request's time to first token on the virtual clock, under a stated model of the
  GPU: a step takes PREFILL_S_PER_TOKEN per prompt token (DECODE_S for a one-token step), saves and
  restores move PCIE_BYTES_PER_S on their own copy streams, and the step's token readback runs on
  the device->host copy engine after every save queued before the step was launched (FIFO). That
  last point is the hypothesis the H200 numbers fit (a 16k device hit: 21 ms without the tier,
  46 ms with it, ~ the 45 ms a 1024-block save takes); the lead's GPU run confirms or refutes it.
Engine idle time between requests is polled as the engine thread does (AHEAD_POLL_S).
--unbounded: the previous top_up (one batch of everything, no idle polling), for before/after.
Defaults: Qwen3-4B at --kv-cache-memory-gib 4 / --kv-offload-host-gib 16 (2.25 MiB blocks of 16
tokens: 1820 device blocks, 7281 host slots), 16384-token prompts.
    python scripts/offload_host_overhead.py [--length 16384] [--repeats 3] [--unbounded] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from openinfer.backends.block_copy import BlockCopier, Pairs, Transfer
from openinfer.backends.cuda_block_copy import CHUNK_BLOCKS
from openinfer.kv import host_tier
from openinfer.kv.block_manager import BlockManager
from openinfer.kv.host_tier import HostTier
from openinfer.request import Request, RequestStream
from openinfer.sampling import SamplingParams
from openinfer.scheduler import Scheduler

BLOCK_BYTES = 36 * 2 * 8 * 128 * 16 * 2   # Qwen3-4B: layers x (K, V) x kv heads x head dim x block x bf16
PREFILL_S_PER_TOKEN = 0.534 / 16384         # the H200's 16k cold prefill
DECODE_S = 0.008                            # a one-token step over a 16k context (in-process hit: 7-10 ms)
PCIE_BYTES_PER_S = 50e9
BLOCK_S = BLOCK_BYTES / PCIE_BYTES_PER_S
GAP_S = 0.002                               # client: a response to the next request


class Clock:
    now = 0.0


class ClockTransfer(Transfer):
    def __init__(self, clock: Clock, land: float) -> None:
        self.clock, self.land = clock, land

    def done(self) -> bool:
        return self.clock.now >= self.land

    def wait(self) -> None:
        self.clock.now = max(self.clock.now, self.land)


class ClockCopier(BlockCopier):
    """Copies as time on two copy engines: d2h (saves, then the step's readback) and h2d."""
    host: list[np.ndarray] = []

    def __init__(self, clock: Clock) -> None:
        self.clock, self.d2h_free, self.h2d_free = clock, 0.0, 0.0
        self.saved_at: dict[int, float] = {}   # device block -> landing of the save reading it
        self.step_waits = 0.0                  # the step stream's wait for reused blocks' saves
        self.save_batches: list[int] = []

    def save(self, pairs: Pairs) -> Transfer:
        start = max(self.clock.now, self.d2h_free)
        for i, (d, _) in enumerate(pairs):   # a chunk's blocks land with its event, as CudaBlockCopier's
            self.saved_at[d] = start + min(len(pairs), (i // CHUNK_BLOCKS + 1) * CHUNK_BLOCKS) * BLOCK_S
        self.d2h_free = start + len(pairs) * BLOCK_S
        self.save_batches.append(len(pairs))
        return ClockTransfer(self.clock, self.d2h_free)

    def reuse(self, blocks: Sequence[int]) -> None:
        self.step_waits = max([self.step_waits] + [self.saved_at.pop(b, 0.0) for b in blocks])

    def restore(self, pairs: Pairs) -> Transfer:
        for i in range(0, len(pairs), CHUNK_BLOCKS):   # each chunk after the saves of its own blocks
            chunk = pairs[i:i + CHUNK_BLOCKS]
            start = max([self.clock.now, self.h2d_free] + [self.saved_at.pop(d, 0.0) for d, _ in chunk])
            self.h2d_free = start + len(chunk) * BLOCK_S
        return ClockTransfer(self.clock, self.h2d_free)


@dataclass
class Rung:
    name: str
    steps: int = 0
    ms: dict[str, float] = field(default_factory=lambda: {"schedule": 0.0, "advance": 0.0, "after_step": 0.0})
    max_after_ms: float = 0.0    # the longest after_step of its steps
    token_step_ms: float = 0.0   # schedule + advance of the step that sampled its (first) token
    ttft_ms: list[float] = field(default_factory=list)   # virtual clock, per request
    saves: list[int] = field(default_factory=list)


class Sim:
    def __init__(self, num_blocks: int, host_blocks: int, max_len: int, budget: int, poll: bool) -> None:
        self.clock, self.poll = Clock(), poll
        self.blocks = BlockManager(num_blocks, 16)
        self.copier = ClockCopier(self.clock)
        self.tier = HostTier(self.blocks, self.copier, host_blocks,
                             watermark_blocks=min(self.blocks.blocks_for(max_len), self.blocks.usable_blocks))
        self.tier.block_bytes = BLOCK_BYTES    # the copier holds no host arrays
        self.scheduler = Scheduler(self.blocks, budget, 64, self.tier)

    def idle(self, seconds: float) -> None:
        """The engine thread's idle loop for `seconds` of virtual time."""
        end = self.clock.now + seconds
        while self.poll and self.tier.saving_ahead() and self.clock.now < end:
            self.clock.now = min(end, self.clock.now + host_tier.AHEAD_POLL_S)
            self.tier.top_up()
        self.clock.now = end

    def run(self, name: str, prompts: list[list[int]]) -> Rung:
        """Requests of one output token each, submitted together and stepped to completion."""
        self.idle(GAP_S)
        rung, saves0, arrival = Rung(name), len(self.copier.save_batches), self.clock.now
        for i, p in enumerate(prompts):
            self.scheduler.add(Request(f"{name}.{i}", p, SamplingParams(max_tokens=1), RequestStream(name), 0.0))
        while self.scheduler.has_work():
            t0 = time.perf_counter()
            plan = self.scheduler.schedule()
            t1 = time.perf_counter()
            if plan.runs:   # the step: compute after the reused blocks' saves, the readback after queued saves
                queued = self.copier.d2h_free
                n = plan.num_tokens
                end = max(self.clock.now, self.copier.step_waits) + (DECODE_S if n == 1 else n * PREFILL_S_PER_TOKEN)
                self.clock.now = max(end, queued) + 20e-6
            t2 = time.perf_counter()
            for run in plan.runs:
                run.req.num_computed = run.start + run.length
                self.blocks.commit(run.req)
                if run.samples:
                    run.req.output_ids.append(0)
                    rung.ttft_ms.append((self.clock.now - arrival) * 1e3)
                    self.scheduler.finish(run.req)
            t3 = time.perf_counter()
            follows = bool(self.scheduler.running or self.scheduler.waiting)
            self.tier.after_step((DECODE_S if plan.num_tokens == 1 else plan.num_tokens * PREFILL_S_PER_TOKEN)
                                 if follows and plan.runs else 0.0)
            t4 = time.perf_counter()
            if not plan.runs and self.tier.busy():
                self.tier.wait()
            for k, dt in zip(rung.ms, (t1 - t0, t3 - t2, t4 - t3)):
                rung.ms[k] += dt * 1e3
            rung.max_after_ms = max(rung.max_after_ms, (t4 - t3) * 1e3)
            if any(run.samples for run in plan.runs) and not rung.token_step_ms:
                rung.token_step_ms = (t1 - t0 + t3 - t2) * 1e3
            rung.steps += 1
        rung.saves = self.copier.save_batches[saves0:]
        return rung


def ladder(sim: Sim, length: int, repeats: int, seed: int) -> list[Rung]:
    rng = np.random.default_rng(seed)
    fresh = lambda: [int(t) for t in rng.integers(0, 150000, length)]
    out = [sim.run("ready", [fresh()])]
    fillers = -(-(sim.blocks.usable_blocks * 16 + length) // length)
    for rep in range(repeats):
        ids = fresh()
        out += [sim.run(f"cold{rep}", [ids]), sim.run(f"hit{rep}", [ids]),
                sim.run(f"fill{rep}", [fresh() for _ in range(fillers)]), sim.run(f"host{rep}", [ids])]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device-blocks", type=int, default=1820)
    ap.add_argument("--host-blocks", type=int, default=7281)
    ap.add_argument("--max-model-len", type=int, default=40960)
    ap.add_argument("--max-num-batched-tokens", type=int, default=1024)
    ap.add_argument("--unbounded", action="store_true", help="the previous top_up: one batch, no idle polling")
    ap.add_argument("--profile", action="store_true", help="cProfile the whole ladder; top 25 by cumulative time")
    args = ap.parse_args()
    if args.unbounded:
        host_tier.AHEAD_MIN_BYTES = 1 << 62
    sim = Sim(args.device_blocks, args.host_blocks, args.max_model_len, args.max_num_batched_tokens,
              poll=not args.unbounded)
    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    rungs = ladder(sim, args.length, args.repeats, 0)
    if prof:
        prof.disable()
    print(f"{'rung':<7} {'steps':>5} | host ms: {'schedule':>8} {'advance':>7} {'after_step':>10} {'max':>5} "
          f"{'token step':>10} | model TTFT ms | save batches (blocks)")
    for r in rungs:
        saves = ",".join(map(str, r.saves[:6])) + (f",... ({len(r.saves)} batches)" if len(r.saves) > 6 else "")
        ttft = ",".join(f"{t:.1f}" for t in r.ttft_ms)
        print(f"{r.name:<7} {r.steps:>5} | {'':>8} {r.ms['schedule']:>8.2f} {r.ms['advance']:>7.2f} "
              f"{r.ms['after_step']:>10.2f} {r.max_after_ms:>5.2f} {r.token_step_ms:>10.2f} | {ttft:>13} | {saves}")
    st = sim.tier.stats
    print(f"saved {st.saved_blocks} blocks ({st.saved_ahead_blocks} ahead), restored {st.restored_blocks}, "
          f"largest save batch {max(sim.copier.save_batches, default=0)} blocks")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
