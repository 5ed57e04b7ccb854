"""Byte ranges of checkpoint files -> staging buffers on a pool of threads, each filled buffer
handed to a sink (the CUDA uploader's async H2D copy) on the thread that filled it.

Positional reads (os.preadv), not copies out of a mmap: no page faults, no mmap lock shared by
the threads, and the checkpoint never counts in our RSS (page-cache pages a mmap touches are our
file-backed RSS until it closes). Each thread owns two buffers and alternates between them: while
the sink's transfer of one is in flight it fills the other. A range is cut into equal pieces, a
multiple of the thread count, so every thread finishes a tensor at about the same time.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol, Sequence

import numpy as np

MIN_PIECE = 1 << 20   # smaller ranges are one piece: a thread hand-off costs more than reading 1 MB


class Handle(Protocol):
    def synchronize(self) -> None: ...


# (filled bytes, destination, byte offset in it, what the sink was given with the range) -> a handle
# whose synchronize() returns once the buffer may be refilled, or None if the sink copied synchronously
Sink = Callable[[np.ndarray, Any, int, Any], "Handle | None"]


def copy_threads() -> int:
    """Reading threads: half the cores, 2 to 8 (one thread copies page-cache pages at ~6-10 GB/s;
    more than 8 saturate host memory bandwidth before they help)."""
    return max(2, min(8, (os.cpu_count() or 2) // 2))


def pieces(nbytes: int, threads: int, max_piece: int) -> list[tuple[int, int]]:
    """(offset, size) pieces covering nbytes: equal sizes of at most max_piece, their count a multiple
    of `threads`, except that no piece is cut below MIN_PIECE (a small range is a few pieces)."""
    count = threads * -(-nbytes // (threads * max_piece))
    size = max(-(-nbytes // max(count, 1)), min(MIN_PIECE, max_piece))
    return [(at, min(size, nbytes - at)) for at in range(0, nbytes, size)]


def read_exactly(fd: int, out: np.ndarray, offset: int) -> None:
    """Fill `out` (uint8, contiguous) with the file's bytes from `offset`; EOFError if the file is short."""
    view, got = memoryview(out).cast("B"), 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise EOFError(f"file ends {len(view) - got} bytes short of offset {offset + len(view)}")
        got += n


class StagedReader:
    def __init__(self, buffers: Sequence[np.ndarray], sink: Sink, threads: int,
                 thread_setup: Callable[[], None] | None = None) -> None:
        """`buffers` (uint8, all one size): len(buffers) // threads per thread. `thread_setup` runs
        first on each reading thread (the CUDA uploader makes its device and a stream current)."""
        per = len(buffers) // threads
        if per < 1 or len({b.nbytes for b in buffers}) != 1:
            raise ValueError(f"need at least one buffer per thread, all one size ({len(buffers)} for {threads})")
        self.threads, self.buffer_bytes = threads, buffers[0].nbytes
        self._lanes = [[[buffers[t * per + i], None] for i in range(per)] for t in range(threads)]
        self._unclaimed = list(self._lanes)
        self._claim_lock = threading.Lock()
        self._local = threading.local()
        self._sink, self._setup = sink, thread_setup
        self._fds: dict[str, int] = {}
        self._futures: list[Future] = []
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="weights", initializer=self._claim)

    def _claim(self) -> None:
        with self._claim_lock:
            self._local.lane, self._local.turn = self._unclaimed.pop(), 0
        if self._setup is not None:
            self._setup()

    def read(self, path: str, offset: int, nbytes: int, dst: Any, context: Any = None) -> list[Future]:
        """Queue bytes [offset, offset + nbytes) of file `path` for dst[0: nbytes]; the futures'
        results are the sink's handles (context goes to the sink with each piece)."""
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        futures = [self._pool.submit(self._piece, fd, offset + at, n, dst, at, context)
                   for at, n in pieces(nbytes, self.threads, self.buffer_bytes)]
        self._futures += futures
        return futures

    def _piece(self, fd: int, offset: int, n: int, dst: Any, at: int, context: Any) -> Handle | None:
        lane, turn = self._local.lane, self._local.turn
        slot = lane[turn]
        self._local.turn = (turn + 1) % len(lane)
        if slot[1] is not None:
            slot[1].synchronize()   # the sink's transfer of this buffer's last contents has finished
        staged = slot[0][:n]
        read_exactly(fd, staged, offset)
        slot[1] = self._sink(staged, dst, at, context)
        return slot[1]

    def finish(self) -> None:
        """Wait for every queued piece and its transfer, raise the first error, close files and threads
        and drop the buffers."""
        try:
            for f in self._futures:
                f.result()
            for lane in self._lanes:
                for slot in lane:
                    if slot[1] is not None:
                        slot[1].synchronize()
        finally:
            self._pool.shutdown(cancel_futures=True)
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            self._futures.clear()
            # the pool's initializer (our _claim) keeps us alive until a GC pass: let the buffers go now
            self._lanes, self._unclaimed = [], []
