"""Kernel lanes (kernels/cuda/lanes.py) on the CPU: a thread's lane, nested and restored; lanes per backend never
collide; and blas keeps one cuBLAS handle (and workspace) per device and lane."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from openinfer.kernels.cuda import lanes


def test_a_lane_is_the_threads_own_and_a_block_restores_it():
    assert lanes.current() == lanes.DEFAULT
    seen = {}

    def other():
        lanes.use("model-b")
        seen["other"] = lanes.current()
    with lanes.lane("model-a"):
        with lanes.lane(lanes.graphs_of("model-a")):
            assert lanes.current() == "model-a/graphs"
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert lanes.current() == "model-a"   # the other thread's use() left this one alone
    assert lanes.current() == lanes.DEFAULT and seen["other"] == "model-b"


def test_new_lanes_are_distinct_and_so_are_their_graphs_lanes():
    a, b = lanes.new("cuda:0"), lanes.new("cuda:0")
    assert a != b and lanes.graphs_of(a) != lanes.graphs_of(b) and a.startswith("cuda:0")


def test_blas_keeps_a_handle_per_device_and_lane(monkeypatch):
    pytest.importorskip("cupy")
    from openinfer.kernels.cuda import blas
    made = []

    class Handle:
        def __init__(self) -> None:
            made.append(self)
            self.workspace = object()
    monkeypatch.setattr(blas, "_Handle", Handle)
    monkeypatch.setattr(blas, "_handles", {})
    monkeypatch.setattr(blas.cp, "cuda", SimpleNamespace(Device=lambda: SimpleNamespace(id=0)), raising=False)
    first = blas.workspace()
    with lanes.lane("model-a"):
        a = blas.workspace()
        assert blas.workspace() is a
    assert blas.workspace() is first and a is not first and len(made) == 2


def test_release_drops_a_lanes_entries_and_its_graphs_lanes_only():
    store = lanes.per_lane({})
    a, b = lanes.new("cuda:0"), lanes.new("cuda:0")
    store.update({(0, a): 1, (0, lanes.graphs_of(a), "decode_attention"): 2, (0, b): 3, (0, lanes.DEFAULT): 4})
    lanes.release(a)
    assert store == {(0, b): 3, (0, lanes.DEFAULT): 4}
