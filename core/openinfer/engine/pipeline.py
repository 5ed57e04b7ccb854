"""Pipelined decode: step N+1 is queued on the device before step N's host bookkeeping.

At steady-state decode the host's work of a step (appending tokens, stop checks, stream events,
block commits, the next step's scheduling and inputs) otherwise runs while the GPU idles. When
step N+1 needs nothing that step N's tokens decide, the engine launches it right after N, feeding
N's greedy tokens to N+1 on the device, and does N's bookkeeping while N+1 computes.

That holds when every row of N runs again in N+1, one token on, with its token the plain argmax:
N is a one-token decode of every running request on a captured graph, every row is plain greedy
(no host or device sampler, no logprobs, no stop ids held back by min_tokens), none reaches
max_tokens or max_model_len with N's token, and no block commit of N queues a device copy (a
hybrid model's rolling state checkpoint, which must read the state before N+1 writes it). The
engine checks what lies outside the plan: nothing to admit, restore or abort. A request that
stops at N was computed in N+1 anyway: its row of N+1 is dropped and its blocks are released only
once N+1 is collected.
"""
from __future__ import annotations

from ..kv.block_manager import BlockManager
from .request import Request
from .scheduler import ScheduledRun, StepPlan


def next_decode_plan(plan: StepPlan, running: list[Request], blocks: BlockManager,
                     max_model_len: int) -> StepPlan | None:
    """Step N+1's plan, made (and its blocks allocated) before N's tokens are known; None when N+1
    must wait for them. `plan` is N's, `running` the scheduler's running requests in order."""
    runs = plan.runs
    if plan.newly_scheduled or len(runs) != len(running):   # (so the token budget held every row)
        return None
    queues_copies = blocks.commit_queues_copies
    for run, req in zip(runs, running):   # every running request, every step: no call but the one hook
        if run.req is not req or run.length != 1 or not run.samples:
            return None
        p, out = req.params, len(req.output_ids)   # out: before N's token
        if not req.plain_greedy or (out < p.min_tokens and req.stop_ids):
            return None
        if out + 1 >= p.max_tokens or len(req.prompt_ids) + out + 1 >= max_model_len:
            return None   # N's token is its last
        if queues_copies(req, run.start + 1):
            return None
    bs = blocks.block_size
    for run in runs:
        if len(run.req.block_ids) * bs < run.start + 2:   # N+1's token starts a block
            blocks.allocate(run.req, run.start + 2)
    return StepPlan([ScheduledRun(run.req, run.start + 1, 1, True) for run in runs])
