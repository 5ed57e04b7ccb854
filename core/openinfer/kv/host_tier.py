"""Host-memory offload tier (`--kv-offload`): a second-level prefix cache for evicted blocks.

Save: each cached block the device pool evicts gets a host slot (the tier's own LRU, its own
capacity) and is copied there by the backend's copier, which holds the device block until the
copy landed (backends/block_copy.py). A block whose hash and tokens the tier already holds is
not copied again.
Restore: at admission, after the device hits, the tier continues the request's chain of block
hashes in host memory (stored tokens compared, as on the device), allocates device blocks from
the request's reservation and copies the blocks back. The request waits in the scheduler's
restoring list until `landed()`; the blocks are then committed to the device prefix cache again.
A request aborted while restoring keeps its blocks until the copies landed (`poll()` frees them),
so admission never hands out a block a copy is still writing.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from ..backends.block_copy import BlockCopier, Transfer
from ..request import Request
from .block_manager import BlockManager
from .pool import StatePools


@dataclass
class OffloadStats:
    capacity_blocks: int
    used_blocks: int = 0
    saved_blocks: int = 0      # device -> host copies issued
    restored_blocks: int = 0   # host -> device copies issued
    dropped_blocks: int = 0    # evicted blocks not saved: every host slot was pinned by a restore
    queries: int = 0           # prompt tokens looked up in host memory (past the device hits)
    hits: int = 0              # of which restored from it

    @property
    def usage(self) -> float:
        return self.used_blocks / self.capacity_blocks

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


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
    def __init__(self, blocks: BlockManager, copier: BlockCopier, capacity_blocks: int) -> None:
        if not blocks.enable_prefix_cache:
            raise ValueError("--kv-offload needs the prefix cache (drop --no-prefix-caching)")
        if capacity_blocks < 1:
            raise ValueError("--kv-offload-host-gib holds no block; raise it")
        self.blocks, self.copier, self.block_size = blocks, copier, blocks.block_size
        self.entries: OrderedDict[int, _Entry] = OrderedDict()   # block hash -> entry; LRU first
        self.free_slots: deque[int] = deque(range(capacity_blocks))
        self.restoring: dict[str, _Restore] = {}    # request id -> its restore in flight
        self.orphans: list[_Restore] = []           # aborted while restoring: blocks held until landed
        self.stats = OffloadStats(capacity_blocks)
        blocks.on_evict = self._evicted
        blocks.on_admit = self._admitted

    # ---- save ----------------------------------------------------------------------------------
    def _evicted(self, evicted: list[tuple[int, int, tuple[int, ...]]]) -> None:
        pairs = []
        for block, h, tokens in evicted:
            e = self.entries.get(h)
            if e is not None and e.tokens == tokens:
                self.entries.move_to_end(h)     # already in host memory
                continue
            if e is not None and e.pins:        # a hash collision with a slot being restored: keep it
                self.stats.dropped_blocks += 1
                continue
            if e is not None:
                del self.entries[h]
                self.free_slots.append(e.slot)
            slot = self._free_slot()
            if slot is None:
                self.stats.dropped_blocks += 1
                continue
            self.entries[h] = _Entry(slot, tokens)
            pairs.append((block, slot))
        if pairs:
            self.copier.save(pairs)
            self.stats.saved_blocks += len(pairs)
        self.stats.used_blocks = len(self.entries)

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
        bs, start = self.block_size, req.num_hashed_blocks
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
        end = start + len(found)
        self.blocks.allocate(req, end * bs)      # its evictions are saved before the restore is issued
        transfer = self.copier.restore([(req.block_ids[i], e.slot) for i, e in enumerate(found, start)])
        req.num_computed = req.cached_tokens = end * bs
        self.stats.hits += len(found) * bs
        self.stats.restored_blocks += len(found)
        self.restoring[req.request_id] = _Restore(req, transfer, found)

    def landed(self, req: Request) -> bool:
        """True when `req` has no restore in flight; a restore that landed is finished here (its
        blocks enter the device prefix cache)."""
        r = self.restoring.get(req.request_id)
        if r is None:
            return True
        if not r.transfer.done():
            return False
        del self.restoring[req.request_id]
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
