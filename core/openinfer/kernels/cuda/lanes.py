"""Lanes: the device scratch that kernels keep from one call to the next, one set per lane.

cuBLAS's workspace and the arrival counters of split kernels (module.arrival_counters) are written by one call and
reused by the next. Two forwards may run on one GPU at the same time: a mixed step's decode rows replay their CUDA
graph on the graphs' own stream while its prompt runs eagerly on the step stream (engine/model_runner.py). So the
graphs are captured in the "graphs" lane and everything else runs in the default one; what a graph bakes in is
never what an eager forward writes.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

DEFAULT, GRAPHS = "default", "graphs"


class _Current(threading.local):
    name = DEFAULT


_current = _Current()


def current() -> str:
    """The calling thread's lane."""
    return _current.name


@contextmanager
def lane(name: str) -> Iterator[None]:
    """Run the block's kernel calls in lane `name` (on this thread)."""
    before, _current.name = _current.name, name
    try:
        yield
    finally:
        _current.name = before
