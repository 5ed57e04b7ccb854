"""`bench latency`: the phase split on a fake engine with a fake clock (exact), then the real in-process
engine once `openinfer.engine` exists."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import run_cli
from openinfer.bench.latency import PointTiming, run_once, sweep


class _Stream:
    def drain(self) -> list:
        return []


@dataclass
class _Stats:
    num_tokens: int
    num_seqs: int


class FakeEngine:
    """Chunked prefill under a token budget, then one token per row per step; each step costs 1 ms/token."""

    def __init__(self, budget: int) -> None:
        self.budget, self.now, self.reqs = budget, 0.0, []

    def add_request(self, ids: list[int], params: int) -> _Stream:
        self.reqs.append({"todo": len(ids), "left": params})
        return _Stream()

    def has_unfinished(self) -> bool:
        return any(r["left"] > 0 for r in self.reqs)

    def step(self) -> _Stats:
        budget, tokens, rows = self.budget, 0, 0
        for r in self.reqs:
            if r["left"] == 0 or budget == 0:
                continue
            n = min(r["todo"], budget) if r["todo"] else 1
            r["todo"] -= min(r["todo"], n)
            if r["todo"] == 0:
                r["left"] -= 1  # a token is sampled once the prompt is done
            budget, tokens, rows = budget - n, tokens + n, rows + 1
        self.now += 0.001 * tokens
        return _Stats(tokens, rows)


def test_phase_split_exact() -> None:
    eng = FakeEngine(budget=16)
    point = PointTiming(2, 12, 3)
    run_once(eng, [[1] * 12, [2] * 12], 3, point, clock=lambda: eng.now)
    # step 1: A's 12 + B's 4; step 2: B's 8 + A's decode -> prefill ends at 25 ms
    assert point.prefill_s == [pytest.approx(0.025)]
    # step 3: both decode (A finishes); step 4: B alone
    assert point.decode_step_s == [pytest.approx(0.002), pytest.approx(0.001)]
    assert point.total_s == [pytest.approx(0.028)]
    s = point.summary()
    assert s["median_prefill_ms"] == pytest.approx(25.0) and s["mean_decode_step_ms"] == pytest.approx(1.5)


def test_sweep_discards_warmups() -> None:
    eng = FakeEngine(budget=1000)
    points = sweep(eng, lambda o: o, [1, 2], [8], [4], vocab=50, warmup=1, iters=2, seed=0)
    assert [(p.batch_size, len(p.prefill_s), len(p.decode_step_s)) for p in points] == [(1, 2, 6), (2, 2, 6)]


def test_latency_cli_on_the_engine(tmp_path: Path) -> None:
    try:
        import openinfer.engine  # noqa: F401
        import openinfer.sampling  # noqa: F401
    except ImportError as e:
        pytest.skip(f"the in-process engine API (openinfer.engine) is not importable yet: {e}")
    out = tmp_path / "lat.json"
    rc = run_cli("bench", "latency", "--batch-sizes", "1,2", "--input-lens", "8", "--output-lens", "3",
                 "--num-iters-warmup", "0", "--num-iters", "1", "--output-json", str(out))
    assert rc == 0
    points = json.loads(out.read_text())["points"]
    assert [(p["batch_size"], p["input_len"], p["output_len"]) for p in points] == [(1, 8, 3), (2, 8, 3)]
    assert all(p["median_prefill_ms"] > 0 and len(p["decode_step_s"]) == 2 for p in points)
