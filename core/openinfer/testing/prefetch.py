"""Where a model calls ops.prefetch (kernels/cuda/prefetch.py), checked on any backend: each call
must name the weight of the next GEMV the model launches, or it warms L2 with the wrong bytes. And,
on a GPU, that decode graphs captured with the prefetches on replay exactly as with them off."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .engine import generate, greedy

GEMVS = ("linear", "linear_silu_mul")


def record_gemvs(ops: Any, monkeypatch: Any) -> list[tuple[str, int]]:
    """Wrap the model's ops (through pytest's `monkeypatch`): each GEMV and prefetch call appends
    (op name, id of its weight) to the returned list; GEMVs still compute."""
    events: list[tuple[str, int]] = []

    def gemv(name: str, real: Any) -> Any:
        return lambda x, w: (events.append((name, id(w))), real(x, w))[1]

    for name in GEMVS:
        monkeypatch.setattr(ops, name, gemv(name, getattr(ops, name)))
    monkeypatch.setattr(ops, "prefetch", lambda w: events.append(("prefetch", id(w))))
    return events


def unprefetched_gemvs(events: list[tuple[str, int]]) -> list[int]:
    """Weight ids of the GEMVs no prefetch named right before them (since the previous GEMV);
    raises if a prefetch names a weight other than that of the next GEMV."""
    missed, pending = [], None
    for i, (name, w) in enumerate(events):
        if name == "prefetch":
            assert pending is None, f"event {i}: two prefetches before one GEMV"
            pending = w
            continue
        if pending is None:
            missed.append(w)
        assert pending in (None, w), f"event {i}: {name} of another weight than the prefetch before it named"
        pending = None
    assert pending is None, "a prefetch after the last GEMV"
    return missed


def assert_prefetches(events: list[tuple[str, int]], unprefetched: Iterable[Any]) -> None:
    """Every prefetch names the next GEMV's weight, and the GEMVs without one are exactly those of
    `unprefetched` (weights whose GEMV follows another GEMV directly: nothing to hide behind)."""
    assert any(name == "prefetch" for name, _ in events), "no prefetch recorded"
    assert set(unprefetched_gemvs(events)) == {id(w) for w in unprefetched}


def assert_prefetch_keeps_replays(make_engine: Callable[[], Any], prompts: Sequence[list[int]], monkeypatch: Any,
                                  mb: int = 8) -> None:
    """GPU: an engine with decode graphs built by `make_engine` with the L2 prefetches on
    (OPENINFER_L2_PREFETCH_MB = mb; the capture fails if the side stream is left unjoined) gives the
    same greedy tokens and bit-identical logits of its last replay as one with them off."""
    import cupy as cp
    from ..kernels.cuda import prefetch
    launched, launch = [], prefetch.launch
    monkeypatch.setattr(prefetch, "launch", lambda *a: launched.append(a[1]) or launch(*a))
    runs = {}
    for on in (False, True):
        monkeypatch.setattr(prefetch, "MB", mb if on else 0)
        engine = make_engine()
        graphs = engine.runner.graphs
        assert graphs is not None and bool(launched) == on
        tokens = [t for t, _, _ in generate(engine, prompts, greedy(16))]
        logits = graphs.graphs[graphs.bucket(len(prompts))][1][:len(prompts)]
        runs[on] = tokens, np.asarray(cp.asnumpy(logits), np.float32)
    assert set(launched) == {"prefetch_l2"}
    assert runs[True][0] == runs[False][0]
    np.testing.assert_array_equal(runs[True][1], runs[False][1])
