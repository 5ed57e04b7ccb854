"""Start-up phases: one INFO line per phase of bringing a model up, with the process's RSS after it.

    with phase("weights") as p:
        ...
        p.detail = "8.05 GB at 21.3 GB/s"
logs `start-up: weights 0.38 s (ends 1.92 s after process start), RSS 512 MB (anon 300, file 200,
shmem 12): 8.05 GB at 21.3 GB/s`. Every phase is also kept in `PHASES` (in the order they end), so
scripts/rss_breakdown.py prints the same table from one run. Phases may run on several threads at
once (the CUDA context is created on a thread while the main one imports): each line says which
thread when it is not the main one.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

log = logging.getLogger("openinfer.startup")
_IMPORTED = time.perf_counter()
T = TypeVar("T")


@dataclass(frozen=True)
class Rss:
    """Resident memory in MiB: total = anon + file + shmem (/proc/self/status)."""
    total: int
    anon: int
    file: int
    shmem: int

    def __str__(self) -> str:
        return f"RSS {self.total} MB (anon {self.anon}, file {self.file}, shmem {self.shmem})"


@dataclass
class Phase:
    name: str
    start: float           # seconds after process start
    seconds: float = 0.0
    rss: Rss | None = None  # after the phase; None off Linux
    detail: str = ""
    thread: str = ""        # "" for the main thread

    @property
    def end(self) -> float:
        return self.start + self.seconds


PHASES: list[Phase] = []


def rss() -> Rss | None:
    """This process's resident memory now, or None where /proc is missing."""
    fields = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    fields[key] = int(value.split()[0]) // 1024
    except OSError:
        return None
    return Rss(fields.get("VmRSS", 0), fields.get("RssAnon", 0), fields.get("RssFile", 0), fields.get("RssShmem", 0))


def _process_started() -> float:
    """perf_counter() at the moment this process started: /proc/self/stat's start time (10 ms ticks)
    against CLOCK_BOOTTIME, so the interpreter's own start and imports count; else this module's import."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return _IMPORTED
    return time.perf_counter() - max(0.0, age)


_STARTED = _process_started()


def since_start() -> float:
    """Seconds since this process started."""
    return time.perf_counter() - _STARTED


@contextmanager
def phase(name: str) -> Iterator[Phase]:
    """Time the block as start-up phase `name`; set `.detail` on the yielded Phase to add to its line."""
    thread = threading.current_thread()
    p = Phase(name, since_start(), thread="" if thread is threading.main_thread() else thread.name)
    t0 = time.perf_counter()
    try:
        yield p
    finally:
        p.seconds, p.rss = time.perf_counter() - t0, rss()
        PHASES.append(p)
        log.info("start-up: %s %.2f s (ends %.2f s after process start)%s%s%s", name, p.seconds, p.end,
                 f" on thread {p.thread}" if p.thread else "", f", {p.rss}" if p.rss else "",
                 f": {p.detail}" if p.detail else "")


def release_free_heap() -> int:
    """Hand the C heap's free pages back to the OS (glibc malloc_trim); returns the anon MiB that left.

    Loading frees far more than it keeps (the tokenizer's JSON parse alone peaks ~95 MB above what
    it retains), and glibc keeps freed pages resident until told; a no-op off glibc."""
    before = rss()
    try:
        ctypes.CDLL(None).malloc_trim(0)   # the process's own symbols: glibc's, where it is glibc
    except (OSError, AttributeError, TypeError):
        return 0
    after = rss()
    return before.anon - after.anon if before and after else 0


def in_background(name: str, fn: Callable[..., T], *args: Any) -> Future[T]:
    """Run fn(*args) as start-up phase `name` on a daemon thread of that name; its Future holds
    the result (or the exception, raised again by .result())."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            with phase(name):
                result = fn(*args)
        except BaseException as e:  # noqa: BLE001 — handed to whoever waits on the future
            future.set_exception(e)
        else:
            future.set_result(result)   # after the phase has logged, so its line comes first

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
