"""Each engine queues its steps on its own backend's stream, whichever backend the thread made current last.

On a GPU a kernel launches on the calling thread's current stream, while a backend's uploads and downloads go on
its own step stream, and building a CUDA backend makes its stream current (CudaBackend.activate). So with two
engines in one thread (tests build an eager and a graph engine side by side) the first one's steps queued their
kernels on the second one's stream, unordered with their own inputs and token downloads: a step's upload buffers
could be reused while its kernels still read them, and its greedy tokens read before they were written. Here a
CPU backend models the thread-current stream, and every op checks that it runs on its own backend's."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import pytest

from openinfer.backends.numpy_backend import NumpyBackend
from openinfer.loading import loader
from openinfer.testing import EngineArgs, build_engine
from openinfer.testing.engine import generate, greedy, prompt_logits


class _Current(threading.local):
    backend: object = None


CURRENT = _Current()   # the thread's current "stream" (CuPy keeps one per thread)


class StreamBackend(NumpyBackend):
    """A CPU backend whose device work must be queued while it is current, as a CUDA backend's must."""

    def __init__(self) -> None:
        super().__init__()
        CURRENT.backend = self   # as CudaBackend.__init__ activates its stream

    @contextmanager
    def current(self) -> Iterator[None]:
        before, CURRENT.backend = CURRENT.backend, self
        try:
            yield
        finally:
            CURRENT.backend = before

    def check(self) -> None:
        assert CURRENT.backend is self, "a step ran on another engine's stream"


def _checked(ops, backend: StreamBackend) -> None:
    for name, fn in list(vars(ops).items()):
        if callable(fn) and not name.startswith("_"):
            def op(*args, _fn=fn, **kw):
                backend.check()
                return _fn(*args, **kw)
            setattr(ops, name, op)


@pytest.fixture
def two_engines(monkeypatch):
    """Two CPU engines of the demo model built one after the other (the second one's backend current)."""
    monkeypatch.setattr(loader, "get_backend", lambda *a, **kw: StreamBackend())
    engines = [build_engine(None, EngineArgs(device="cpu", max_num_seqs=2)) for _ in range(2)]
    for eng in engines:
        _checked(eng.runner.model.ops, eng.runner.backend)
    return engines


def test_each_engine_steps_on_its_own_stream(two_engines):
    first, second = two_engines
    prompt = list(range(3, 20))
    want = generate(second, [prompt], greedy(4))[0][0]
    assert generate(first, [prompt], greedy(4))[0][0] == want
    assert CURRENT.backend is second.runner.backend   # a step leaves the thread's current stream as it was


def test_prompt_logits_runs_on_the_engine_s_own_stream(two_engines):
    first, second = two_engines
    ids = list(range(3, 12))
    assert (prompt_logits(first, ids) == prompt_logits(second, ids)).all()
