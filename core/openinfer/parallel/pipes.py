"""A CPU group of processes over multiprocessing pipes: rank 0 is the hub every other rank talks to.

For the numpy backend (CPU expert parallelism and its tests). A rank whose peer's process died
reads end-of-file on the pipe and raises RankFailed instead of waiting.
"""
from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from .communicator import RankFailed

_GONE = (EOFError, OSError)   # a closed pipe: the peer's process exited (BrokenPipeError is an OSError)


class PipeCommunicator:
    """rank 0 holds `peers[r - 1]`, the pipe to rank r; every other rank holds one pipe, to rank 0."""

    def __init__(self, rank: int, world_size: int, peers: list[Connection]) -> None:
        if len(peers) != (world_size - 1 if rank == 0 else 1):
            raise ValueError(f"rank {rank} of {world_size} needs {world_size - 1 if rank == 0 else 1} pipe(s)")
        self.rank, self.world_size, self.peers = rank, world_size, peers

    def _gathered(self, x: Any, combine: Any) -> Any:
        """Rank 0 receives every rank's x, combines them in rank order and sends the result back."""
        x = np.asarray(x)
        if self.rank == 0:
            parts = [x] + [self._recv(r + 1, c) for r, c in enumerate(self.peers)]
            out = combine(parts)
            for r, c in enumerate(self.peers):
                self._send(r + 1, c, out)
            return out
        self._send(0, self.peers[0], x)
        return self._recv(0, self.peers[0])

    def all_reduce(self, x: Any) -> Any:
        def total(parts: list[np.ndarray]) -> np.ndarray:
            out = parts[0].copy()
            for p in parts[1:]:
                out += p
            return out
        return self._gathered(x, total)

    def all_gather(self, x: Any) -> Any:
        return self._gathered(x, np.stack)

    def broadcast(self, x: Any, root: int = 0) -> Any:
        return self._gathered(x, lambda parts: parts[root])

    def barrier(self) -> None:
        self._gathered(np.zeros(0, np.float32), lambda parts: parts[0])

    def abort(self) -> None:
        """Nothing to do: the ranks are processes, and a dead one's pipe reads end-of-file (closing a pipe
        here while another thread reads it would not wake that thread)."""

    @staticmethod
    def _send(peer: int, conn: Connection, x: np.ndarray) -> None:
        try:
            conn.send(x)
        except _GONE as e:
            raise RankFailed(f"expert-parallel rank {peer} is gone ({type(e).__name__})") from None

    @staticmethod
    def _recv(peer: int, conn: Connection) -> np.ndarray:
        try:
            return conn.recv()
        except _GONE as e:
            raise RankFailed(f"expert-parallel rank {peer} is gone ({type(e).__name__})") from None
