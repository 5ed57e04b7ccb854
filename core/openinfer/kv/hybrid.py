"""Block manager for hybrid models: paged KV plus a bounded per-request state (kind "slots").

Every running request owns one state row (its Gated DeltaNet conv window and recurrent
matrices); admission needs a free row, and at most `num_slots` are handed out. The attention KV
of a prefix is worthless without the recurrent state *at the same token*, and that state cannot
be rebuilt from blocks: it summarises the whole prefix. So a prefix hit is valid only at a block
boundary where a state checkpoint exists, and a hit is cut back to the last such boundary.

Which boundaries get a checkpoint. A checkpoint is a whole row (tens of MB for a real model,
about a hundred attention blocks' worth), so keeping one per block is out of the question.
We keep them only where reuse is likely and the state is at hand for free:
  * the last full block of each prompt — the same prompt sent again hits it. The prefill is not
    cut there: when a step's run crosses that boundary, `prefill_chunk` reserves a row and marks
    the request (`state_checkpoint`), and the forward itself writes the state as of the boundary
    token into the row (the model's state ops read `checkpoint_lens`/`checkpoint_rows` of the
    batch); `commit` registers the row once the step has run. (Cutting the step at the boundary
    instead cost a second, tiny prefill step: ~10 ms of a 1024-token prompt's TTFT on an H200.)
  * any other prefill chunk that ends on a block boundary (long prompts chunked by the budget)
    — a long shared prefix (system prompt, document) hits the last one below the divergence;
  * during decode, one rolling checkpoint per request: each boundary the sequence crosses
    replaces the request's previous one, so when it finishes, its last full block has a
    checkpoint and turn 2 of the conversation (prompt + answer + new message) reuses turn 1.
Checkpoints live in their own rows of the same state arrays, in an LRU keyed by the chained
block hash (which already covers the tokens, the parent chain and the salt); they are plain
cache entries, never pinned. Other saves and all restores are row copies queued here in order and
run by the model runner before the next forward (`take_state_copies`): the order keeps a save
ahead of a restore of the same row, and a restore ahead of a later overwrite (a forward's own
save included). A row reserved for an in-forward save is in neither the free list nor the LRU
until `commit`, so nothing restores from it before it is written.

Row 0 is never handed out (padding rows of a batch may point at it), like block 0.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Iterable

from ..engine.request import Request
from .block_manager import BlockManager

if TYPE_CHECKING:
    from ..engine.scheduler import ScheduledRun


def num_state_rows(num_slots: int, num_checkpoints: int) -> int:
    return 1 + num_slots + num_checkpoints


class CheckpointLRU:
    """Checkpoint rows keyed by block hash, least recently used first."""

    def __init__(self, first_row: int, count: int) -> None:
        self.free: deque[int] = deque(range(first_row, first_row + count))
        self.rows: OrderedDict[int, int] = OrderedDict()   # block hash -> row

    def find(self, h: int) -> int | None:
        row = self.rows.get(h)
        if row is not None:
            self.rows.move_to_end(h)
        return row

    def reserve(self) -> int | None:
        """A row for a new checkpoint, evicting the least recently used if needed; `add` it once written."""
        if self.free:
            return self.free.popleft()
        return self.rows.popitem(last=False)[1] if self.rows else None

    def add(self, h: int, row: int) -> None:
        if h in self.rows:
            self.free.append(row)   # another request saved the same tokens' state first
        else:
            self.rows[h] = row

    def take(self, h: int) -> int | None:
        """A row for a new checkpoint under `h` (written by a copy queued before any restore of it)."""
        row = self.reserve()
        if row is not None:
            self.rows[h] = row
        return row

    def drop(self, h: int) -> None:
        row = self.rows.pop(h, None)
        if row is not None:
            self.free.append(row)


class HybridBlockManager(BlockManager):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool, num_slots: int,
                 num_checkpoints: int, block_hash: str = "builtin") -> None:
        super().__init__(num_blocks, block_size, enable_prefix_cache, block_hash)
        if num_slots < 1:
            raise ValueError("a hybrid model needs at least one state slot")
        self.free_slots: deque[int] = deque(range(1, num_slots + 1))
        self.checkpointing = enable_prefix_cache and num_checkpoints > 0
        self.checkpoints = CheckpointLRU(1 + num_slots, num_checkpoints)
        self.rolling: dict[str, int] = {}      # request id -> hash of its decode checkpoint
        self.copies: list[tuple[int, int]] = []

    def _match(self, req: Request) -> tuple[list[int], int | None]:
        """No copy-on-write of the last token's block: the checkpoint at the prompt's end already
        holds the last token's state, and the state before it (which recomputing it needs) is not kept."""
        hits = super()._match(req)[0] if self.checkpointing else []
        while hits and self.checkpoints.find(req.block_hashes[len(hits) - 1]) is None:
            hits.pop()
        return hits, None

    def try_admit(self, req: Request) -> bool:
        if not self.free_slots or not super().try_admit(req):
            return False
        req.state_slot = self.free_slots.popleft()
        if req.num_computed:
            # _match only keeps hits that end on a checkpoint, and nothing evicted it since
            row = self.checkpoints.rows[req.block_hashes[req.num_computed // self.block_size - 1]]
            self.copies.append((row, req.state_slot))
        return True

    def prefill_chunk(self, req: Request, n: int) -> int:
        """All `n` tokens; if the run crosses the prompt's last full block, the step saves the state there."""
        # (whether the boundary already has a checkpoint is left to `add`: a prompt whose checkpoint is kept hits
        # it, and starts past the boundary)
        start, boundary = req.num_computed, (len(req.prompt_ids) - 1) // self.block_size * self.block_size
        if self.checkpointing and start < boundary < start + n:
            row = self.checkpoints.reserve()
            if row is not None:
                req.state_checkpoint = (boundary, row)
        return n

    def commit_runs(self, runs: Iterable[ScheduledRun]) -> None:
        for run in runs:   # a request's state checkpoint is taken whether or not a block completed
            run.req.num_computed = run.start + run.length
            self.commit(run.req)

    def commit(self, req: Request) -> None:
        super().commit(req)
        if req.state_checkpoint is not None:   # the step wrote it: it may be hit from now on
            boundary, row = req.state_checkpoint
            req.state_checkpoint = None
            self.checkpoints.add(req.block_hashes[boundary // self.block_size - 1], row)
        n = req.num_computed
        if not self.checkpointing or n == 0 or n % self.block_size:
            return
        h = req.block_hashes[n // self.block_size - 1]
        if self.checkpoints.find(h) is not None:
            return   # the same tokens' state is already kept (identical by construction)
        decoding = n > len(req.prompt_ids)
        if decoding and req.request_id in self.rolling:
            self.checkpoints.drop(self.rolling.pop(req.request_id))
        row = self.checkpoints.take(h)
        if row is None:
            return
        self.copies.append((req.state_slot, row))
        if decoding:
            self.rolling[req.request_id] = h

    def release(self, req: Request) -> None:
        super().release(req)
        self.rolling.pop(req.request_id, None)   # its last checkpoint stays for the next turn
        if req.state_checkpoint is not None:     # its step failed: the reserved row was never written
            self.checkpoints.free.append(req.state_checkpoint[1])
            req.state_checkpoint = None
        if req.state_slot is not None:
            self.free_slots.append(req.state_slot)
            req.state_slot = None

    def take_state_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    def commit_queues_copies(self, req: Request, num_computed: int) -> bool:
        return self.checkpointing and num_computed % self.block_size == 0
