"""Lanes: the device scratch that kernels keep from one call to the next, one set per lane.

cuBLAS's handle and workspace and the arrival counters of split kernels (module.arrival_counters) are written by one
call and reused by the next, so two forwards running at once on one GPU must not share them. Each CUDA backend (a
model: several may share a GPU, each stepping in its engine's thread) runs its kernels in a lane of its own, and its
decode graphs capture in another: a mixed step's decode rows replay their graph on the graphs' stream while its
prompts run eagerly on the step stream (engine/model_runner.py). Kernels called outside any backend (tests,
benchmarks) run in the default lane.
"""
from __future__ import annotations

import itertools
import threading
from contextlib import contextmanager
from typing import Iterator

DEFAULT, GRAPHS = "default", "graphs"
_numbers = itertools.count()
_stores: list[dict] = []   # dicts keyed (device, lane, ...), registered by per_lane


class _Current(threading.local):
    name = DEFAULT


_current = _Current()


def current() -> str:
    """The calling thread's lane."""
    return _current.name


def use(name: str) -> None:
    """Make `name` the calling thread's lane (until the next use or lane block)."""
    _current.name = name


@contextmanager
def lane(name: str) -> Iterator[None]:
    """Run the block's kernel calls in lane `name` (on this thread)."""
    before, _current.name = _current.name, name
    try:
        yield
    finally:
        _current.name = before


def new(owner: str) -> str:
    """A lane no one else has, named after its owner (for logs and errors)."""
    return f"{owner}#{next(_numbers)}"


def graphs_of(name: str) -> str:
    """The lane the decode graphs of the owner of lane `name` capture in."""
    return f"{name}/{GRAPHS}"


def side_of(name: str) -> str:
    """The lane of the side stream beside lane `name`'s (beside.py)."""
    return f"{name}/side"


def per_lane(store: dict) -> dict:
    """Register `store`, a dict keyed (device, lane, ...), so that `release` drops a lane's entries."""
    _stores.append(store)
    return store


def release(name: str) -> None:
    """Drop what every per-lane store holds for lane `name`, its graphs lane and their side lanes: a backend that is
    gone (its graphs with it) hands its handles, workspaces and counters back."""
    gone = (name, graphs_of(name), side_of(name), side_of(graphs_of(name)))
    for store in _stores:
        for key in [k for k in list(store) if k[1] in gone]:   # (list: a snapshot, whatever other threads add)
            store.pop(key, None)
