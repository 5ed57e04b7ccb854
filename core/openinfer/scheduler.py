"""Continuous batching with chunked prefill under a per-step token budget.

Each step: every running request in decode gets one token, then running prefills continue and
waiting requests are admitted (FCFS) into the remaining budget. Admission reserves the request's
whole KV lifetime (block_manager), so running requests never stall; requests that cannot fit yet
wait, and those that can never fit were rejected at submit.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .kv.block_manager import BlockManager
from .request import Request, Status


@dataclass
class ScheduledRun:
    req: Request
    start: int          # first token index of the run (== req.num_computed)
    length: int         # tokens computed this step
    samples: bool       # the run reaches the sequence end, so its last row is sampled


@dataclass
class StepPlan:
    runs: list[ScheduledRun] = field(default_factory=list)
    newly_scheduled: list[Request] = field(default_factory=list)
    state_copies: list[tuple[int, int]] = field(default_factory=list)   # run before the forward

    @property
    def num_tokens(self) -> int:
        return sum(r.length for r in self.runs)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_batched_tokens: int, max_num_seqs: int) -> None:
        self.blocks = blocks
        self.max_tokens = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        plan, budget = StepPlan(), self.max_tokens
        decoding = [r for r in self.running if r.num_computed >= r.num_tokens - 1]
        prefilling = [r for r in self.running if r.num_computed < r.num_tokens - 1]
        for r in decoding:
            if budget == 0:
                break
            plan.runs.append(self._run(r, 1))
            budget -= 1
        for r in prefilling:
            if budget == 0:
                break
            n = self.blocks.prefill_chunk(r, min(r.num_tokens - r.num_computed, budget))
            plan.runs.append(self._run(r, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            r = self.waiting[0]
            if not self.blocks.try_admit(r):
                break
            self.waiting.popleft()
            r.status = Status.RUNNING
            self.running.append(r)
            plan.newly_scheduled.append(r)
            n = self.blocks.prefill_chunk(r, min(r.num_tokens - r.num_computed, budget))
            plan.runs.append(self._run(r, n))
            budget -= n
        if plan.runs:   # an empty plan is not run, so its copies wait for the next one
            plan.state_copies = self.blocks.take_state_copies()
        return plan

    def _run(self, r: Request, n: int) -> ScheduledRun:
        self.blocks.allocate(r, r.num_computed + n)
        return ScheduledRun(r, r.num_computed, n, r.num_computed + n == r.num_tokens)

    def finish(self, req: Request) -> None:
        """Drop a request from whichever queue holds it and return its KV at once."""
        if req.status == Status.RUNNING:
            self.running.remove(req)
            self.blocks.release(req)
        elif req.status == Status.WAITING:
            self.waiting.remove(req)
        req.status = Status.FINISHED
