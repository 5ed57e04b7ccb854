"""Block allocation with lifetime reservations and a prefix cache.

Admission reserves a request's whole lifetime of blocks (prompt + max_tokens, minus prefix hits),
so a running request never waits for memory and nothing needs preempting; blocks are taken from
the reservation as the sequence grows. Full blocks are registered under chained hashes (parent
hash, token ids, salt); unreferenced cached blocks stay reusable until evicted in LRU order.
Block 0 is never handed out: padding rows of a batch point at it.

A full-prompt hit recomputes only the last prompt token (its logits are needed to sample), so that
step is one token and runs as a decode step. Cached blocks are immutable (other requests may be
reading them), so when the last prompt token falls in a cached block, the request gets a private
copy of that block (copy-on-write: `take_block_copies`, run on the device before the next forward)
and writes the recomputed token there.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from ..engine.request import Request

if TYPE_CHECKING:
    from ..engine.scheduler import ScheduledRun


@dataclass
class CacheStats:
    queries: int = 0   # prompt tokens looked up
    hits: int = 0      # of which served from the cache


def token_blocks(tokens: list[int], block_size: int, start: int = 0) -> list[tuple[int, ...]]:
    """The full blocks of `tokens` from block `start`, as the tuples that are hashed and compared."""
    stop = len(tokens) // block_size * block_size
    return [tuple(tokens[i:i + block_size]) for i in range(start * block_size, stop, block_size)]


BLOCK_HASHES = ("builtin", "sha256")


def sha256_key(parent: int | None, tokens: tuple[int, ...], salt: str) -> int:
    """128 bits of sha256 over (parent key, token ids, salt): a chain no prompt can be built to collide with.
    Python's hash() of ints is the same in every process and not made to resist that, and a hit compares
    only the block's own ids, so with "builtin" a crafted prompt could share another's prefix KV."""
    d = hashlib.sha256(b"-" if parent is None else parent.to_bytes(16, "little"))   # lengths tell the fields apart
    d.update(array("q", tokens).tobytes())   # a full block: block_size ids, 8 bytes each
    d.update(salt.encode())
    return int.from_bytes(d.digest()[:16], "little")


def chain(blocks: Iterable[tuple[int, ...]], salt: str = "", parent: int | None = None, scheme: str = "builtin"
          ) -> Iterator[tuple[int, tuple[int, ...]]]:
    """(chained hash, tokens) of each block in turn: the one definition of a block's cache key.
    scheme "builtin": Python's hash() (fast); "sha256": sha256_key (--prefix-cache-hash sha256)."""
    h = parent
    if scheme == "sha256":
        for tokens in blocks:
            h = sha256_key(h, tokens, salt)
            yield h, tokens
        return
    for tokens in blocks:
        h = hash((h, tokens, salt))
        yield h, tokens


def chain_hashes(blocks: Iterable[tuple[int, ...]], salt: str = "", parent: int | None = None,
                 scheme: str = "builtin") -> list[int]:
    return [h for h, _ in chain(blocks, salt, parent, scheme)]


def block_hashes(tokens: list[int], block_size: int, salt: str = "", start: int = 0,
                 parent: int | None = None, scheme: str = "builtin") -> list[int]:
    """Chained hashes of the full blocks of `tokens` from block `start`."""
    return chain_hashes(token_blocks(tokens, block_size, start), salt, parent, scheme)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True,
                 block_hash: str = "builtin") -> None:
        if num_blocks < 2:
            raise ValueError("the KV pool needs at least 2 blocks; raise the KV memory budget")
        if block_hash not in BLOCK_HASHES:
            raise ValueError(f"unknown prefix-cache hash {block_hash!r}: use one of {', '.join(BLOCK_HASHES)}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_cache, self.block_hash = enable_prefix_cache, block_hash
        self.ref = [0] * num_blocks
        self.free: deque[int] = deque(range(1, num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()   # cached, unreferenced; LRU first
        self.by_hash: dict[int, int] = {}
        self.hash_of: dict[int, int] = {}
        self.tokens_of: dict[int, tuple[int, ...]] = {}
        self.reserved = 0
        self.stats = CacheStats()
        self.block_copies: list[tuple[int, int]] = []   # (cached src, private dst), src referenced until taken
        # seams for the host offload tier (kv/host_tier.py): the cached blocks one allocate()
        # evicted, as (block, hash, tokens), reported before anything can write them; and every
        # admitted request, after its device hits were taken
        self.on_evict: Callable[[list[tuple[int, int, tuple[int, ...]]]], None] | None = None
        self.on_admit: Callable[[Request], None] | None = None

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_available(self) -> int:
        return len(self.free) + len(self.evictable) - self.reserved

    def usage(self) -> float:
        """Fraction of usable blocks referenced by requests or reserved for them."""
        used = self.usable_blocks - len(self.free) - len(self.evictable) + self.reserved
        return used / self.usable_blocks

    def _match(self, req: Request) -> tuple[list[int], int | None]:
        """The cached blocks of the prompt's chain before the last token's block, and the cached
        block holding the last token when it is a full block of the prompt and all before it hit.
        `req.block_hashes` covers every full block of the prompt: the host tier continues the chain."""
        if not self.enable_prefix_cache:
            return [], None
        # one pass, each block's tuple hashed, compared and let go at once: a list of a 16k prompt's
        # 1024 tuples alive together set off a collection of the GC per hit
        ids, bs = req.prompt_ids, self.block_size
        by_hash, tokens_of = self.by_hash, self.tokens_of
        hashes: list[int] = []
        hits: list[int] = []
        hitting = req.reads_prefix_cache
        for h, tokens in chain(zip(*[iter(ids)] * bs), req.cache_salt, None, self.block_hash):   # tuples built in C
            hashes.append(h)
            if hitting:
                b = by_hash.get(h)
                if b is not None and tokens_of[b] == tokens:
                    hits.append(b)
                else:
                    hitting = False
        req.block_hashes = hashes
        # the block holding the last token is apart: the copy-on-write source, when it ends the prompt
        src = hits.pop() if len(hits) > (len(ids) - 1) // bs else None
        return hits, src

    def _unref(self, b: int) -> None:
        self.ref[b] -= 1
        if self.ref[b] == 0:
            if b in self.hash_of:
                self.evictable[b] = None
            else:
                self.free.append(b)

    def try_admit(self, req: Request) -> bool:
        """Take the prefix hits and reserve the rest of the lifetime, or change nothing."""
        hits, src = self._match(req)
        shared = hits + [src] if src is not None else hits
        need = self.blocks_for(req.max_total_tokens) - len(hits)
        ref = self.ref
        revived = [b for b in shared if ref[b] == 0]   # cached and unreferenced: they leave the evictable set
        if need + len(revived) > self.num_available():
            return False
        evictable = self.evictable
        for b in revived:
            del evictable[b]
        for b in shared:   # _ref's work, without a call per block of a long prompt
            ref[b] += 1
        req.block_ids = hits
        req.num_hashed_blocks = len(hits)
        req.num_computed = req.cached_tokens = len(hits) * self.block_size
        req.reserved_blocks = need
        self.reserved += need
        if src is not None:   # copy-on-write: the private copy comes out of the reservation
            self.allocate(req, len(req.prompt_ids))
            self.block_copies.append((src, req.block_ids[-1]))
            req.num_computed = req.cached_tokens = len(req.prompt_ids) - 1
        self.stats.queries += len(req.prompt_ids)
        self.stats.hits += req.cached_tokens
        if self.on_admit is not None:
            self.on_admit(req)
        return True

    def allocate(self, req: Request, num_tokens: int) -> None:
        """Grow the block table to hold `num_tokens` tokens (always within the reservation)."""
        if len(req.block_ids) * self.block_size >= num_tokens:
            return   # most decode steps: the last block has room
        evicted: list[tuple[int, int, tuple[int, ...]]] = []
        while len(req.block_ids) * self.block_size < num_tokens:
            if req.reserved_blocks <= 0:
                raise RuntimeError(f"{req.request_id} outgrew its KV reservation")
            req.reserved_blocks -= 1
            self.reserved -= 1
            b = self._take(evicted)
            self.ref[b] = 1
            req.block_ids.append(b)
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)

    def _take(self, evicted: list[tuple[int, int, tuple[int, ...]]]) -> int:
        if self.free:
            return self.free.popleft()
        b, _ = self.evictable.popitem(last=False)
        h = self.hash_of.pop(b)
        del self.by_hash[h]
        evicted.append((b, h, self.tokens_of.pop(b)))
        return b

    def commit_runs(self, runs: Iterable[ScheduledRun]) -> None:
        """After a step: each run's request has its run computed; register the full blocks that completed. One call
        a step, and a call of commit() only for a request whose computed tokens reach past its registered blocks
        (a decode row completes a block once every block_size steps)."""
        bs, cache, commit = self.block_size, self.enable_prefix_cache, self.commit
        for run in runs:
            req = run.req
            req.num_computed = n = run.start + run.length
            if cache and n // bs > req.num_hashed_blocks:
                commit(req)

    def commit(self, req: Request) -> None:
        """Register the request's newly completed full blocks in the prefix cache."""
        # most decode steps complete no block: num_computed alone (an upper bound of `full`) tells
        if not self.enable_prefix_cache or req.num_computed // self.block_size <= req.num_hashed_blocks:
            return
        full = min(req.num_computed, req.num_tokens) // self.block_size
        if full <= req.num_hashed_blocks:
            return
        first, bs = req.num_hashed_blocks, self.block_size
        blocks = token_blocks(req.token_slice(first * bs, full * bs), bs)   # only the new blocks' ids
        hashes = req.block_hashes   # the prompt's full blocks were hashed at admission (_match)
        if len(hashes) < full:      # blocks past them: chain them on
            parent = hashes[-1] if hashes else None
            hashes = req.block_hashes = hashes + chain_hashes(blocks[len(hashes) - first:], req.cache_salt, parent,
                                                              self.block_hash)
        for i, tokens in enumerate(blocks, start=first):
            h, b = hashes[i], req.block_ids[i]
            if h not in self.by_hash and b not in self.hash_of:
                self.by_hash[h] = b
                self.hash_of[b] = h
                self.tokens_of[b] = tokens
        req.num_hashed_blocks = full

    def release(self, req: Request) -> None:
        """Return a finished or aborted request's blocks and reservation at once."""
        for b in reversed(req.block_ids):   # tail blocks become the first eviction candidates
            self._unref(b)
        self.reserved -= req.reserved_blocks
        req.block_ids, req.reserved_blocks = [], 0

    def take_block_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write block copies (src, dst) to run before the next forward. The sources are
        let go now: the copies are queued on the device ahead of any later write to them."""
        copies, self.block_copies = self.block_copies, []
        for src, _ in copies:
            self._unref(src)
        return copies

    # ---- bounded-state hooks: kv/hybrid.py overrides them; paged-only models need none ----
    def prefill_chunk(self, req: Request, n: int) -> int:
        """How many of the `n` tokens the scheduler offers a prefill run to actually take (a hybrid
        manager also plans the state checkpoint the run saves on its way)."""
        return n

    def take_state_copies(self) -> list[tuple[int, int]]:
        """State-row copies (src, dst) to run, in order, before the next forward."""
        return []

    def commit_queues_copies(self, req: Request, num_computed: int) -> bool:
        """Whether committing the request at `num_computed` tokens may queue a state copy (the
        pipelined engine commits step N after queueing step N+1, too late for such a copy)."""
        return False
