"""Continuous batching with chunked prefill under a per-step token budget.

Each step: every running request in decode gets one token, then running prefills continue and
waiting requests are admitted into the remaining budget: first come first served, or under the priority
policy by their priority (lower first), then arrival. Admission reserves the request's
whole KV lifetime (block_manager), so running requests never stall; requests that cannot fit yet
wait, and those that can never fit were rejected at submit. With a host offload tier, a request
whose prefix is being restored from host memory waits in `restoring` (holding its blocks) and
starts in the first step after the copies landed.
The other choices of one prompt (n > 1) wait until the first has computed it, then hit it in the prefix cache:
the prompt is computed once, not n times.
A request scoring its prompt (prompt logprobs) has the logits of every prompt row computed; a step holds at
most max(max_num_seqs, max_num_batched_tokens // 32) such rows: their logits (256 rows of a 152k vocabulary
in bf16 on a GPU, 78 MB) stay well below the activations the engine measured for a full step, and they are
computed after the layers, when those are free. A 1k prompt scores in 46 ms at 256 rows a step and 181 ms at 64
(Qwen3-4B shape, H100, scripts/gpu_prompt_logprobs.py), against 15 ms unscored.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..kv.block_manager import BlockManager
from ..kv.host_tier import HostTier
from .request import Request, Status


@dataclass(slots=True)   # slots: one is made per running request and step
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
    block_copies: list[tuple[int, int]] = field(default_factory=list)   # copy-on-write, before the forward

    @property
    def num_tokens(self) -> int:
        return sum(r.length for r in self.runs)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_batched_tokens: int, max_num_seqs: int,
                 host_tier: HostTier | None = None, policy: str = "fcfs") -> None:
        self.blocks, self.host_tier, self.by_priority = blocks, host_tier, policy == "priority"
        self.max_tokens = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.max_score_rows = max(max_num_seqs, max_num_batched_tokens // 32)
        self._score_rows = self.max_score_rows   # prompt rows a step may still score (reset each step)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.restoring: list[Request] = []

    def add(self, req: Request) -> None:
        """Queue `req`: at the end, or under the priority policy after every waiting request of its priority or a
        lower one (the queue stays sorted by priority, arrivals in order within one)."""
        if self.by_priority and self.waiting and self.waiting[-1].priority > req.priority:
            at = next(i for i, w in enumerate(self.waiting) if w.priority > req.priority)
            self.waiting.insert(at, req)
        else:
            self.waiting.append(req)

    def can_admit(self) -> bool:
        """Whether a waiting request might be admitted now: a running seat is free and the pool holds its
        lifetime, its whole prompt taken as a prefix hit (an upper bound, no hashing). False lets a pipelined
        engine queue the next decode step while requests wait behind a full batch."""
        if not self.waiting or len(self.running) + len(self.restoring) >= self.max_seqs:
            return False
        r = next((w for w in self.waiting if not w.waits_for_leader()), None)   # the one schedule() tries first
        if r is None:
            return False
        blocks = self.blocks
        return blocks.blocks_for(r.max_total_tokens) - len(r.prompt_ids) // blocks.block_size <= blocks.num_available()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.restoring) or (
            self.host_tier is not None and self.host_tier.busy())

    def schedule(self) -> StepPlan:
        plan, budget = StepPlan(), self.max_tokens
        self._score_rows = self.max_score_rows
        tier = self.host_tier
        if tier is not None:
            tier.poll()
        # decode rows take their token as they come, prefills are set aside for what is left (one pass, no call
        # per decode row but the allocation that crosses into a new block: it runs for every running request)
        prefilling, runs, bs, allocate = [], plan.runs, self.blocks.block_size, self.blocks.allocate
        for r in self.running:
            start, end = r.num_computed, len(r.prompt_ids) + len(r.output_ids)
            if start < end - 1:
                prefilling.append(r)
            elif budget:
                if len(r.block_ids) * bs <= start:
                    allocate(r, start + 1)
                runs.append(ScheduledRun(r, start, 1, start + 1 == end))
                budget -= 1
        for r in prefilling:
            if budget == 0:
                break
            if n := self._chunk(r, budget):
                plan.runs.append(self._run(r, n))
                budget -= n
        if tier is not None:
            for r in [r for r in self.restoring if tier.landed(r)]:
                self.restoring.remove(r)
                budget = self._start(r, plan, budget)
        later = []   # choices whose leader still computes their prompt: admitted once it is cached
        while self.waiting and budget > 0 and len(self.running) + len(self.restoring) < self.max_seqs:
            r = self.waiting[0]
            if r.waits_for_leader():
                later.append(self.waiting.popleft())
                continue
            if not self.blocks.try_admit(r):
                break
            self.waiting.popleft()
            if tier is not None and not tier.landed(r):
                r.status = Status.RESTORING
                self.restoring.append(r)
                continue
            budget = self._start(r, plan, budget)
        self.waiting.extendleft(reversed(later))
        if plan.runs:   # an empty plan is not run, so its copies wait for the next one
            plan.state_copies = self.blocks.take_state_copies()
            plan.block_copies = self.blocks.take_block_copies()
        return plan

    def _start(self, r: Request, plan: StepPlan, budget: int) -> int:
        """Move an admitted request to running and give it what is left of the budget."""
        r.status = Status.RUNNING
        self.running.append(r)
        plan.newly_scheduled.append(r)
        n = self._chunk(r, budget)
        if n:
            plan.runs.append(self._run(r, n))
        return budget - n

    def _chunk(self, r: Request, budget: int) -> int:
        """The tokens r's prefill run takes this step: the rest of its sequence within the budget, and
        for a request scoring its prompt, only as many prompt rows as the step has left."""
        n = min(r.num_tokens - r.num_computed, budget)
        rows = len(r.prompt_ids) - 1 - r.num_computed   # prompt rows still to score
        if r.params.prompt_logprobs is None or rows <= 0:
            return self.blocks.prefill_chunk(r, n)
        n = self.blocks.prefill_chunk(r, min(n, self._score_rows) if rows > self._score_rows else n)
        self._score_rows -= min(n, rows)
        return n

    def _run(self, r: Request, n: int) -> ScheduledRun:
        start = r.num_computed
        self.blocks.allocate(r, start + n)
        return ScheduledRun(r, start, n, start + n == r.num_tokens)

    def finish(self, req: Request) -> None:
        """Drop a request from whichever queue holds it and return its KV at once."""
        if req.status == Status.RUNNING:
            self.running.remove(req)
            self.blocks.release(req)
        elif req.status == Status.RESTORING:
            self.restoring.remove(req)
            self.host_tier.abort(req)
        elif req.status == Status.WAITING:
            self.waiting.remove(req)
        req.status = Status.FINISHED
