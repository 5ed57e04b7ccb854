"""An in-process group: one communicator per thread, exchanging through shared slots (tests, CPU)."""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .communicator import RankFailed


class LocalGroup:
    """`world_size` communicators for threads of one process. A rank that fails calls `abort()`, so
    the others raise RankFailed instead of waiting for it."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._slots: list[Any] = [None] * world_size
        self._barrier = threading.Barrier(world_size)
        self.communicators = [LocalCommunicator(self, r) for r in range(world_size)]

    def exchange(self, rank: int, x: Any) -> list[Any]:
        """Every rank's x, in rank order (copies, shared by the ranks: read them, never write them)."""
        try:
            self._slots[rank] = np.array(x, copy=True)
            self._barrier.wait()
            got = list(self._slots)
            self._barrier.wait()   # no rank writes its next slot before every rank has read this one
        except threading.BrokenBarrierError:
            raise RankFailed("a rank of the in-process group failed") from None
        return got

    def abort(self) -> None:
        self._barrier.abort()


class LocalCommunicator:
    def __init__(self, group: LocalGroup, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def all_reduce(self, x: Any) -> Any:
        parts = self.group.exchange(self.rank, x)
        total = parts[0].copy()   # the slots are shared by every rank: sum into a copy
        for p in parts[1:]:   # rank order: every rank adds the same way, so all get the same bits
            total += p
        return total

    def all_gather(self, x: Any) -> Any:
        return np.stack(self.group.exchange(self.rank, x))

    def broadcast(self, x: Any, root: int = 0) -> Any:
        return self.group.exchange(self.rank, x)[root]

    def barrier(self) -> None:
        self.group.exchange(self.rank, np.zeros(0, np.float32))

    def abort(self) -> None:
        self.group.abort()
