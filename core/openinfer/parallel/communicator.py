"""The collectives expert parallelism needs, and how an expert count splits over ranks."""
from __future__ import annotations

from typing import Any, Protocol

Array = Any   # a backend array: numpy.ndarray on the CPU, cupy.ndarray on CUDA


class RankFailed(RuntimeError):
    """A rank of the group is gone (its process died or its connection closed): the group cannot
    compute any more, so the engine that owns it dies instead of waiting."""


class Communicator(Protocol):
    """One rank's view of its group. Every rank calls the same collectives in the same order with
    arrays of the same shape and dtype; the results are identical on every rank."""
    rank: int
    world_size: int

    def all_reduce(self, x: Array) -> Array:
        """The sum of x over the ranks (may reuse x's memory: use the returned array)."""

    def all_gather(self, x: Array) -> Array:
        """[world_size, *x.shape]: every rank's x, in rank order."""

    def broadcast(self, x: Array, root: int = 0) -> Array:
        """Rank `root`'s x on every rank (may reuse x's memory: use the returned array)."""

    def barrier(self) -> None: ...

    def abort(self) -> None:
        """Give up: collectives in progress or to come raise (or return) instead of waiting."""


def expert_shard(num_experts: int, rank: int, world_size: int) -> tuple[int, int]:
    """(offset, count) of the routed experts rank `rank` holds: a contiguous, equal share."""
    if world_size < 1 or num_experts % world_size:
        raise ValueError(f"{num_experts} experts do not split evenly over {world_size} expert-parallel ranks")
    count = num_experts // world_size
    return rank * count, count
