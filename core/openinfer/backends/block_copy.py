"""Whole-block copies between the device state pools and a host pool of the same layout.

The host offload tier (kv/host_tier.py) moves KV blocks with these primitives; a backend builds
the copier for its own memory (numpy: a second pool of plain arrays, copies done at once; CUDA:
pinned host arrays, a dedicated copy stream, events saying when a copy landed). Each array is
[num_blocks, ...] on the device and [num_host_blocks, ...] on the host, so block i of every array
is one contiguous slice and a run of consecutive blocks is one copy.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import numpy as np

Pairs = Sequence[tuple[int, int]]   # (device block, host slot)


class Transfer(ABC):
    """One batch of copies in flight."""

    @abstractmethod
    def done(self) -> bool:
        """True once every copy of the batch landed (never blocks)."""

    @abstractmethod
    def wait(self) -> None:
        """Block the calling thread until the batch landed."""

    def copy_ms(self) -> float | None:
        """GPU time from the batch's start on its copy stream to its landing, once landed; None
        where copies are synchronous or untimed."""
        return None


class DoneTransfer(Transfer):
    """A batch that landed before it was returned (synchronous copies)."""

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        pass


class BlockCopier(ABC):
    """save(): device blocks -> host slots; restore(): host slots -> device blocks.
    Guarantees: a save reads the blocks as device work queued before it left them; a restore
    reads what earlier saves wrote to its host slots, and does not overwrite a device block
    before an earlier save of it has read it; device work queued after reuse(blocks) returns
    does not write those blocks before the saves reading them landed. A save alone orders no
    device work after it (its blocks stay cached, unwritten): saving ahead of eviction costs the
    step nothing. The caller's duties: reuse() before handing saved blocks to a new owner other
    than a restore; no save into a host slot that a restore whose Transfer is not done yet reads."""

    host: list[np.ndarray]   # the host pool, one array per device array

    @abstractmethod
    def save(self, pairs: Pairs) -> Transfer: ...

    @abstractmethod
    def reuse(self, blocks: Sequence[int]) -> None: ...

    @abstractmethod
    def restore(self, pairs: Pairs) -> Transfer: ...


def runs(pairs: Pairs) -> list[tuple[int, int, int]]:
    """(device start, host start, count): maximal runs where both sides step by +1, or both by -1
    (a chain evicted tail first sits in descending blocks and slots); each run is one copy, since
    the pairs of one batch are independent of each other's order."""
    out: list[list[int]] = []   # [device low, host low, count, direction (0: one pair so far)]
    for d, h in pairs:
        if out:
            lo_d, lo_h, n, step = out[-1]
            if step >= 0 and d == lo_d + n and h == lo_h + n:
                out[-1] = [lo_d, lo_h, n + 1, 1]
                continue
            if step <= 0 and d == lo_d - 1 and h == lo_h - 1:
                out[-1] = [d, h, n + 1, -1]
                continue
        out.append([d, h, 1, 0])
    return [(d, h, n) for d, h, n, _ in out]


class HostPoolCopier(BlockCopier):
    """The numpy backend's copier: the host tier is a second pool of numpy arrays."""

    def __init__(self, device_arrays: Sequence[Any], num_host_blocks: int) -> None:
        self.device = list(device_arrays)
        self.host = [np.zeros((num_host_blocks, *a.shape[1:]), dtype=a.dtype) for a in self.device]

    def save(self, pairs: Pairs) -> Transfer:
        for dev, host in zip(self.device, self.host):
            for d, h, n in runs(pairs):
                host[h:h + n] = dev[d:d + n]
        return DoneTransfer()

    def reuse(self, blocks: Sequence[int]) -> None:
        pass   # every save landed before save() returned: nothing left to order

    def restore(self, pairs: Pairs) -> Transfer:
        for dev, host in zip(self.device, self.host):
            for d, h, n in runs(pairs):
                dev[d:d + n] = host[h:h + n]
        return DoneTransfer()
