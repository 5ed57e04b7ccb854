"""Host-memory offload tier (`--kv-offload`): a second-level prefix cache for evicted blocks.

Save: a cached block gets a host slot (the tier's own LRU, its own capacity) and is copied there
by the backend's copier (backends/block_copy.py), ahead of demand or at the latest when the
device pool evicts it. Ahead: after each engine step `top_up()` saves, in the background, the
cached blocks that the next allocations would evict (the LRU front of the device cache, as many
as the reservations plus a watermark need beyond the free blocks). They stay in the device prefix
cache; evicting one later costs no copy, since a block whose hash and tokens the tier already
holds is not copied again. A restore then finds clean blocks to evict and never waits for a save
(with a full pool, each block it takes would otherwise first be copied out: twice the traffic).
Saves ahead go in batches, one in flight at a time, sized to stay off the next step's path: a
step's own device->host copies (its sampled tokens) queue on the copy engine behind whatever save
was issued before them, so a batch of a whole 16k-token prompt (2.4 GB, ~45 ms of PCIe) issued as
the engine went idle could hold the next request's first token for all of it. While more steps
follow, a batch is what the copy moves in the step just run (at half of PCIe speed: it lands
within the next step); before an idle engine, a small one (~1 ms), and the engine keeps calling
top_up() between requests until the watermark is met.
Restore: at admission, after the device hits, the tier continues the request's chain of block
hashes in host memory (stored tokens compared, as on the device), allocates device blocks from
the request's reservation and copies the blocks back. The request waits in the scheduler's
restoring list until `landed()`; the blocks are then committed to the device prefix cache again.
A prompt of whole blocks restored to its end gets its last token's block too, into a block of its
own (nothing else reads it, so no copy-on-write), and only the last token is recomputed: its first
step is one token, a decode-graph replay, as for a device hit. That block enters the device cache
once the step recomputed the token, like any block the request completes.
Evicted blocks handed to any other owner are `reuse()`d (the copier orders later device work
after their pending saves); those handed to a restore need not be (the copier orders each
restore chunk after the saves of its own blocks).
A request aborted while restoring keeps its blocks until the copies landed (`poll()` frees them),
so admission never hands out a block a copy is still writing.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ..backends.block_copy import BlockCopier, Transfer
from ..engine.request import Request, Status
from .block_manager import BlockManager
from .offload_stats import OffloadStats, restore_report
from .pool import StatePools

log = logging.getLogger("openinfer.kv.host_tier")
AHEAD_MIN_BYTES = 64 << 20       # a save-ahead batch nothing hides: ~1.3 ms of copy at PCIe Gen5 speed
AHEAD_BYTES_PER_S = 25e9         # save-ahead bytes per second of the step just run: half PCIe Gen5 x16
AHEAD_POLL_S = 0.001             # an idle engine's poll for a save-ahead batch to land
Evicted = list[tuple[int, int, tuple[int, ...]]]   # (device block, hash, tokens)


@dataclass
class _Entry:
    slot: int
    tokens: tuple[int, ...]
    pins: int = 0              # restores in flight that read this slot


@dataclass
class _Restore:
    req: Request
    transfer: Transfer
    entries: list[_Entry] = field(default_factory=list)
    admitted: float = 0.0      # time.monotonic() when admission handed it to the tier
    issued: float = 0.0        # when its copies were queued (after the host lookups and the allocation)
    saved_first: int = 0       # blocks evicted for it that had no host copy yet (saved just before)
    landed: float = 0.0        # when landed() saw the copies done


def offloadable_arrays(pools: StatePools) -> list[Any]:
    """Every array the tier moves: all parts of all paged groups. A model with a state group
    that cannot be checkpointed cannot use the tier: its prefix could not be rebuilt from blocks."""
    for g in pools.groups.values():
        if not g.checkpointable:
            raise ValueError(f"--kv-offload: state group {g.name!r} cannot be checkpointed, so this model's "
                             "prefixes cannot be restored from host memory; serve it without --kv-offload")
        if g.kind != "paged":
            raise ValueError(f"--kv-offload: state group {g.name!r} is of kind {g.kind!r}; the host tier moves "
                             "paged blocks only so far; serve this model without --kv-offload")
    return [arr for parts in pools.paged.values() for arr in parts.values()]


class HostTier:
    def __init__(self, blocks: BlockManager, copier: BlockCopier, capacity_blocks: int,
                 watermark_blocks: int = 0) -> None:
        """watermark_blocks: clean blocks (free, or cached with a host copy) to keep ready beyond
        the reservations; the largest restore admission can ask for is the natural size. At most
        half the host capacity, so saving ahead never crowds out host-only prefixes."""
        if not blocks.enable_prefix_cache:
            raise ValueError("--kv-offload needs the prefix cache (drop --no-prefix-caching)")
        if capacity_blocks < 1:
            raise ValueError("--kv-offload-host-gib holds no block; raise it")
        self.blocks, self.copier, self.block_size = blocks, copier, blocks.block_size
        self.block_bytes = sum(h.strides[0] for h in copier.host)
        self.watermark = min(watermark_blocks, capacity_blocks // 2)
        self.entries: OrderedDict[int, _Entry] = OrderedDict()   # block hash -> entry; LRU first
        self.free_slots: deque[int] = deque(range(capacity_blocks))
        self.restoring: dict[str, _Restore] = {}    # request id -> its restore in flight
        self.orphans: list[_Restore] = []           # aborted while restoring: blocks held until landed
        self.reporting: list[_Restore] = []         # landed, logged once the first token came
        self.stats = OffloadStats(capacity_blocks)
        self._ahead: Transfer | None = None         # the last top_up() save
        self._clean_at: tuple[int, ...] = ()        # pool state when top_up() last found nothing to save
        self._for_restore = False                   # inside the allocation of a restore's blocks
        blocks.on_evict = self._evicted
        blocks.on_admit = self._admitted

    # ---- save ----------------------------------------------------------------------------------
    def _evicted(self, evicted: Evicted) -> None:
        self._save(evicted)
        if not self._for_restore:
            self.copier.reuse([b for b, _, _ in evicted])

    def top_up(self, hide_s: float = 0.0) -> None:
        """Save the cached blocks the next allocations will evict (LRU first) that have no host
        copy yet: enough that the reservations plus the watermark find free or clean blocks. One
        background batch at a time, none while a restore is in flight (its request waits for it;
        PCIe is full duplex, but host memory and the copy engines are shared); a pool state
        already found clean is not scanned again. hide_s: the seconds of device work the batch
        may overlap before the next step's copies queue behind it (0: the engine goes idle)."""
        if self._ahead is not None and not self._ahead.done():
            return
        self._ahead = None
        bm = self.blocks
        want = min(bm.reserved + self.watermark - len(bm.free), len(bm.evictable), self.stats.capacity_blocks // 2)
        if want <= 0 or self.restoring:
            return
        state = (len(bm.free), len(bm.evictable), bm.reserved, self.stats.saved_blocks, self.stats.restored_blocks)
        if state == self._clean_at:
            return
        entries, hash_of = self.entries, bm.hash_of
        dirty = [(b, hash_of[b], bm.tokens_of[b]) for b in islice(
            (b for b in islice(bm.evictable, want) if hash_of[b] not in entries), self._batch_blocks(hide_s))]
        before = self.stats.saved_blocks
        self._ahead = self._save(dirty, ahead=True) if dirty else None
        self.stats.saved_ahead_blocks += self.stats.saved_blocks - before
        if self._ahead is None:
            self._clean_at = state

    def saving_ahead(self) -> bool:
        """The last top_up() issued a batch: more may follow once it landed (call top_up() again)."""
        return self._ahead is not None

    def _batch_blocks(self, hide_s: float) -> int:
        return max(1, int(max(AHEAD_MIN_BYTES, hide_s * AHEAD_BYTES_PER_S)) // self.block_bytes)

    def _save(self, evicted: Evicted, ahead: bool = False) -> Transfer | None:
        """Copy the blocks the host does not hold yet; a block that finds no slot is dropped, or
        (saved ahead: still on the device) left for a later save."""
        pairs = []
        for block, h, tokens in evicted:
            e = self.entries.get(h)
            if e is not None and e.tokens == tokens:
                self.entries.move_to_end(h)     # already in host memory
                continue
            if e is not None and e.pins:        # a hash collision with a slot being restored: keep it
                self.stats.dropped_blocks += int(not ahead)
                continue
            if e is not None:
                del self.entries[h]
                self.free_slots.append(e.slot)
            slot = self._free_slot()
            if slot is None:
                self.stats.dropped_blocks += int(not ahead)
                continue
            self.entries[h] = _Entry(slot, tokens)
            pairs.append((block, slot))
        self.stats.used_blocks = len(self.entries)
        if not pairs:
            return None
        self.stats.saved_blocks += len(pairs)
        return self.copier.save(pairs)

    def _free_slot(self) -> int | None:
        if self.free_slots:
            return self.free_slots.popleft()
        for h, e in self.entries.items():       # LRU first; restores in flight pin their slots
            if not e.pins:
                del self.entries[h]
                return e.slot
        return None

    # ---- restore -------------------------------------------------------------------------------
    def _admitted(self, req: Request) -> None:
        last = len(req.prompt_ids) - 1
        if req.num_computed >= last or not req.reads_prefix_cache:
            return                               # the device held the whole prompt (copy-on-write), or it scores it
        admitted, bs, start = time.monotonic(), self.block_size, req.num_hashed_blocks
        chain = req.block_hashes[start:]
        self.stats.queries += len(chain) * bs
        found: list[_Entry] = []
        for i, h in enumerate(chain, start):
            e = self.entries.get(h)
            if e is None or e.tokens != tuple(req.prompt_ids[i * bs:(i + 1) * bs]):
                break
            e.pins += 1                          # before allocate(): its evictions must not reuse the slot
            self.entries.move_to_end(h)
            found.append(e)
        if not found:
            return
        end, saved = start + len(found), self.stats.saved_blocks
        self._for_restore = True                 # its evictions are saved (if need be) before the restore
        try:
            self.blocks.allocate(req, end * bs)
        finally:
            self._for_restore = False
        transfer = self.copier.restore([(req.block_ids[i], e.slot) for i, e in enumerate(found, start)])
        # a restore to the prompt's end (its last token's block included, into the request's own
        # block) leaves that token to recompute, for its logits: a one-token step, as a device hit
        cached = min(end * bs, last)
        self.stats.hits += cached - req.num_computed
        req.num_computed = req.cached_tokens = cached
        self.stats.restored_blocks += len(found)
        self.restoring[req.request_id] = _Restore(req, transfer, found, admitted, time.monotonic(),
                                                  self.stats.saved_blocks - saved)

    def landed(self, req: Request) -> bool:
        """True when `req` has no restore in flight; a restore that landed is finished here (its
        blocks enter the device prefix cache)."""
        r = self.restoring.get(req.request_id)
        if r is None:
            return True
        if not r.transfer.done():
            return False
        del self.restoring[req.request_id]
        r.landed = time.monotonic()
        self.reporting.append(r)
        self._unpin(r)
        self.blocks.commit(req)
        return True

    def abort(self, req: Request) -> None:
        """Return an admitted request's blocks: now, or once a restore still writing them landed."""
        r = self.restoring.pop(req.request_id, None)
        if r is not None and not r.transfer.done():
            self.orphans.append(r)
            return
        if r is not None:
            self._unpin(r)
        self.blocks.release(req)

    def poll(self) -> None:
        """Free the blocks of aborted restores that landed."""
        for r in [r for r in self.orphans if r.transfer.done()]:
            self.orphans.remove(r)
            self._unpin(r)
            self.blocks.release(r.req)

    def after_step(self, hide_s: float = 0.0) -> None:
        """The engine's call after each step: report the restores whose first token came, then
        top_up(hide_s) (after the step's releases, so it sees what the next allocations will evict)."""
        for r in list(self.reporting):
            if r.req.first_token_time is not None:
                log.info("%s", restore_report(r.req.request_id, len(r.entries) * self.block_bytes,
                                              len(r.entries), r.transfer.copy_ms(), r.saved_first,
                                              (r.admitted, r.issued, r.landed, r.req.first_token_time)))
            if r.req.first_token_time is not None or r.req.status is Status.FINISHED:
                self.reporting.remove(r)
        self.top_up(hide_s)

    def busy(self) -> bool:
        return bool(self.restoring or self.orphans)

    def wait(self) -> None:
        """Block until the oldest restore in flight landed (the engine has nothing else to run)."""
        oldest = next(iter(self.restoring.values()), None) or (self.orphans[0] if self.orphans else None)
        if oldest is not None:
            oldest.transfer.wait()

    def _unpin(self, r: _Restore) -> None:
        for e in r.entries:
            e.pins -= 1

