"""Host-side cost of the KV offload tier per engine step, at the block counts of the H200 run, on the CPU.

The scheduler, block manager and host tier run for real; the model does not (a step only advances
num_computed, commits and samples token 0), and the copier is the numpy one over one-byte blocks, so
what is timed is the Python bookkeeping alone. The ladder is `openinfer bench prefix --host-restore`'s:
a ready prompt, then per repeat cold, device hit, fillers (pool + one prompt of fresh tokens, one at
a time) and host restore. Defaults: Qwen3-4B at --kv-cache-memory-gib 4 / --kv-offload-host-gib 16
(2.25 MiB blocks of 16 tokens: 1820 device blocks, 7281 host slots), 16384-token prompts.
Prints per rung: the steps' host ms (schedule = admission + allocation, advance = commit + release,
after_step = top_up) and the blocks each device->host save batch moved (at ~50 GB/s over PCIe each
2.25 MiB block is ~45 us of copy-engine time, which the step's own small copies may queue behind).
    python scripts/offload_host_overhead.py [--length 16384] [--repeats 3] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from dataclasses import dataclass, field

import numpy as np

from openinfer.backends.block_copy import HostPoolCopier, Pairs, Transfer
from openinfer.kv.block_manager import BlockManager
from openinfer.kv.host_tier import HostTier
from openinfer.request import Request, RequestStream
from openinfer.sampling import SamplingParams
from openinfer.scheduler import Scheduler


class CountingCopier(HostPoolCopier):
    """The numpy copier, recording the size of each save batch."""

    def __init__(self, num_blocks: int, host_blocks: int) -> None:
        super().__init__([np.zeros((num_blocks, 1), np.int8)], host_blocks)
        self.save_batches: list[int] = []

    def save(self, pairs: Pairs) -> Transfer:
        self.save_batches.append(len(pairs))
        return super().save(pairs)


@dataclass
class Rung:
    name: str
    steps: int = 0
    ms: dict[str, float] = field(default_factory=lambda: {"schedule": 0.0, "advance": 0.0, "after_step": 0.0})
    max_after_ms: float = 0.0    # the longest after_step of its steps
    first_step_ms: float = 0.0   # schedule + advance of the step that sampled its token (host ms before it is sent)
    saves: list[int] = field(default_factory=list)


class Sim:
    def __init__(self, num_blocks: int, host_blocks: int, max_len: int, budget: int) -> None:
        self.blocks = BlockManager(num_blocks, 16)
        self.copier = CountingCopier(num_blocks, host_blocks)
        self.tier = HostTier(self.blocks, self.copier, host_blocks,
                             watermark_blocks=min(self.blocks.blocks_for(max_len), self.blocks.usable_blocks))
        self.scheduler = Scheduler(self.blocks, budget, 64, self.tier)

    def run(self, name: str, prompt: list[int]) -> Rung:
        """One request of one output token, stepped to completion as Engine.step does."""
        r = Request(name, prompt, SamplingParams(max_tokens=1), RequestStream(name), 0.0)
        self.scheduler.add(r)
        rung, saves0 = Rung(name), len(self.copier.save_batches)
        while self.scheduler.has_work():
            t0 = time.perf_counter()
            plan = self.scheduler.schedule()
            t1 = time.perf_counter()
            for run in plan.runs:
                run.req.num_computed = run.start + run.length
                self.blocks.commit(run.req)
                if run.samples:
                    run.req.output_ids.append(0)
                    run.req.first_token_time = time.monotonic()
                    self.scheduler.finish(run.req)
            t2 = time.perf_counter()
            self.tier.after_step()
            t3 = time.perf_counter()
            if not plan.runs and self.tier.busy():
                self.tier.wait()
            for k, dt in zip(rung.ms, (t1 - t0, t2 - t1, t3 - t2)):
                rung.ms[k] += dt * 1e3
            rung.max_after_ms = max(rung.max_after_ms, (t3 - t2) * 1e3)
            if any(run.samples for run in plan.runs):
                rung.first_step_ms = (t2 - t0) * 1e3
            rung.steps += 1
        rung.saves = self.copier.save_batches[saves0:]
        return rung


def ladder(sim: Sim, length: int, repeats: int, seed: int) -> list[Rung]:
    rng = np.random.default_rng(seed)
    fresh = lambda: [int(t) for t in rng.integers(0, 150000, length)]
    out = [sim.run("ready", fresh())]
    fillers = -(-(sim.blocks.usable_blocks * 16 + length) // length)
    for rep in range(repeats):
        ids = fresh()
        out += [sim.run(f"cold{rep}", ids), sim.run(f"hit{rep}", ids)]
        for i in range(fillers):
            out.append(sim.run(f"fill{rep}.{i}", fresh()))
        out.append(sim.run(f"host{rep}", ids))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device-blocks", type=int, default=1820)
    ap.add_argument("--host-blocks", type=int, default=7281)
    ap.add_argument("--max-model-len", type=int, default=40960)
    ap.add_argument("--max-num-batched-tokens", type=int, default=1024)
    ap.add_argument("--profile", action="store_true", help="cProfile the whole ladder; top 25 by cumulative time")
    args = ap.parse_args()
    sim = Sim(args.device_blocks, args.host_blocks, args.max_model_len, args.max_num_batched_tokens)
    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    rungs = ladder(sim, args.length, args.repeats, 0)
    if prof:
        prof.disable()
    print(f"{'rung':<10} {'steps':>5} {'schedule':>9} {'advance':>8} {'after_step':>10} {'max':>6} {'token step':>10}  save batches (blocks)")
    for r in rungs:
        saves = ",".join(map(str, r.saves[:8])) + (f",... ({len(r.saves)})" if len(r.saves) > 8 else "")
        print(f"{r.name:<10} {r.steps:>5} {r.ms['schedule']:>9.2f} {r.ms['advance']:>8.2f} {r.ms['after_step']:>10.2f} {r.max_after_ms:>6.2f} "
              f"{r.first_step_ms:>10.2f}  {saves}")
    st = sim.tier.stats
    print(f"saved {st.saved_blocks} blocks ({st.saved_ahead_blocks} ahead), restored {st.restored_blocks}, "
          f"largest save batch {max(sim.copier.save_batches, default=0)} blocks")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
