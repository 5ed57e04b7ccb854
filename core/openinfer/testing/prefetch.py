"""Where a model calls ops.prefetch (kernels/cuda/prefetch.py), checked on any backend: each call
must name the weight of the next GEMV the model launches, or it warms L2 with the wrong bytes."""
from __future__ import annotations

from typing import Any, Iterable

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
