"""`bench latency`: the phase split on a fake engine with a fake clock (exact), then the real in-process
engine once `openinfer.engine.engine` exists."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import run_cli
from openinfer.bench.latency import PointTiming, run_once, sweep
from openinfer.engine.request import Scheduled, Tokens


class _Stream:
    def __init__(self) -> None:
        self.events: list = [Scheduled(0)]

    def drain(self) -> list:
        events, self.events = self.events, []
        return events


@dataclass
class _Stats:
    num_tokens: int
    num_seqs: int


class FakeEngine:
    """The scheduler's order under a token budget: one token for each decoding row first, then the
    prefills in turn; a row's token is sampled once its prompt is done. Each step costs 1 ms/token."""

    def __init__(self, budget: int) -> None:
        self.budget, self.now, self.reqs = budget, 0.0, []

    def add_request(self, ids: list[int], params: int) -> _Stream:
        self.reqs.append({"todo": len(ids), "left": params, "stream": _Stream()})
        return self.reqs[-1]["stream"]

    def has_unfinished(self) -> bool:
        return any(r["left"] > 0 for r in self.reqs)

    def step(self) -> _Stats:
        live = [r for r in self.reqs if r["left"] > 0]
        budget, tokens, rows = self.budget, 0, 0
        for r in [r for r in live if not r["todo"]] + [r for r in live if r["todo"]]:
            if budget == 0:
                break
            n = min(r["todo"], budget) if r["todo"] else 1
            r["todo"] -= min(r["todo"], n)
            if r["todo"] == 0:
                r["left"] -= 1
                r["stream"].events.append(Tokens([7], []))
            budget, tokens, rows = budget - n, tokens + n, rows + 1
        self.now += 0.001 * tokens
        return _Stats(tokens, rows)


def test_phase_split_exact() -> None:
    eng = FakeEngine(budget=16)
    point = PointTiming(2, 12, 3)
    run_once(eng, [[1] * 12, [2] * 12], 3, point, clock=lambda: eng.now)
    # step 1: A's 12 + B's 4; step 2: A's decode + B's 8 -> prefill ends at 25 ms
    assert point.prefill_s == [pytest.approx(0.025)]
    # step 3: both decode (A finishes); step 4: B alone
    assert point.decode_step_s == [pytest.approx(0.002), pytest.approx(0.001)]
    assert point.total_s == [pytest.approx(0.028)]
    s = point.summary()
    assert s["median_prefill_ms"] == pytest.approx(25.0) and s["mean_decode_step_ms"] == pytest.approx(1.5)


def test_decode_tokens_do_not_end_prefill_early() -> None:
    """The decoding rows' tokens fill the budget alongside the prompts', so the steps' tokens reach
    the prompt total (48 after step 3) while C still has 2 prompt tokens: step 4 is still prefill."""
    eng = FakeEngine(budget=16)
    point = PointTiming(3, 16, 3)
    run_once(eng, [[1] * 16, [2] * 16, [3] * 16], 3, point, clock=lambda: eng.now)
    # 1: A 16; 2: A 1 + B 15; 3: A 1 (its last) + B 1 + C 14; 4: B 1 + C 2
    assert point.prefill_s == [pytest.approx(0.051)]
    # 5: B (its last) and C; 6: C alone
    assert point.decode_step_s == [pytest.approx(0.002), pytest.approx(0.001)]


def test_sweep_discards_warmups() -> None:
    eng = FakeEngine(budget=1000)
    points = sweep(eng, lambda o: o, [(1, 8), (2, 8)], [4], vocab=50, warmup=1, iters=2, seed=0)
    assert [(p.batch_size, len(p.prefill_s), len(p.decode_step_s)) for p in points] == [(1, 2, 6), (2, 2, 6)]


def test_sweep_reports_each_point_as_it_ends() -> None:
    """`measured` sees the points so far after each one (the CLI writes its JSON there: a run stopped by a timeout
    keeps what it finished), in the order of the given (batch, input) pairs."""
    seen = []
    sweep(FakeEngine(budget=1000), lambda o: o, [(2, 8), (1, 4)], [3], vocab=50, warmup=0, iters=1, seed=0,
          measured=lambda points: seen.append([(p.batch_size, p.input_len) for p in points]))
    assert seen == [[(2, 8)], [(2, 8), (1, 4)]]


def test_latency_cli_on_the_engine(tmp_path: Path) -> None:
    try:
        import openinfer.engine.engine  # noqa: F401
        import openinfer.sampling.sampler  # noqa: F401
    except ImportError as e:
        pytest.skip(f"the in-process engine API (openinfer.engine.engine) is not importable yet: {e}")
    out = tmp_path / "lat.json"
    rc = run_cli("bench", "latency", "--batch-sizes", "1,2", "--input-lens", "8", "--output-lens", "3",
                 "--num-iters-warmup", "0", "--num-iters", "1", "--output-json", str(out))
    assert rc == 0
    points = json.loads(out.read_text())["points"]
    assert [(p["batch_size"], p["input_len"], p["output_len"]) for p in points] == [(1, 8, 3), (2, 8, 3)]
    assert all(p["median_prefill_ms"] > 0 and len(p["decode_step_s"]) == 2 for p in points)
    assert run_cli("bench", "latency", "--points", "2x4,1x8", "--output-lens", "2", "--num-iters-warmup", "0",
                   "--num-iters", "1", "--output-json", str(out)) == 0
    assert [(p["batch_size"], p["input_len"]) for p in json.loads(out.read_text())["points"]] == [(2, 4), (1, 8)]


def test_latency_cli_at_reduced_depth() -> None:
    """`--load-format dummy --num-layers N`: the model's first N layers at the real width (the demo model here)."""
    from openinfer.testing import EngineArgs, get_plugins, read_source
    assert run_cli("bench", "latency", "--load-format", "dummy", "--num-layers", "1", "--batch-sizes", "1",
                   "--input-lens", "8", "--output-lens", "2", "--num-iters-warmup", "0", "--num-iters", "1") == 0
    names = read_source(None, EngineArgs(load_format="dummy", num_layers=1), get_plugins()).shapes
    assert any(".layers.0." in n for n in names) and not any(".layers.1." in n for n in names)


def test_latency_cli_shuts_its_engine_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine (its expert-parallel workers, its threads) stops when the sweep ends, also when it fails."""
    from openinfer.engine import engine as engine_module
    built = []
    real = engine_module.build_engine

    def build(*a, **k):   # noqa: ANN002, ANN003, ANN202
        eng = real(*a, **k)
        calls = []
        monkeypatch.setattr(eng, "shutdown", lambda: calls.append(1))
        built.append(calls)
        return eng
    monkeypatch.setattr(engine_module, "build_engine", build)
    assert run_cli("bench", "latency", "--batch-sizes", "1", "--input-lens", "4", "--output-lens", "2",
                   "--num-iters-warmup", "0", "--num-iters", "1") == 0
    monkeypatch.setattr("openinfer.bench.latency.sweep", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run_cli("bench", "latency", "--batch-sizes", "1", "--input-lens", "4", "--output-lens", "2")
    assert built == [[1], [1]]


@pytest.mark.parametrize("flags,budget", [(["--batch-sizes", "1,4", "--input-lens", "8,16"], 64),
                                          (["--batch-sizes", "128", "--input-lens", "4096"], 65536),
                                          (["--batch-sizes", "128", "--input-lens", "4096",
                                            "--max-num-batched-tokens", "300000"], 300000)])
def test_latency_budget(monkeypatch: pytest.MonkeyPatch, flags: list, budget: int) -> None:
    """The step budget: the largest batch x input (prefill in one step) up to 65,536 tokens, whose activation profile
    fits beside a 4B model on one GPU (128 x 4k in one step did not); --max-num-batched-tokens overrides it."""
    from openinfer.engine import engine as engine_module
    seen = []

    def build(model, args, *rest):   # noqa: ANN001, ANN002, ANN202
        seen.append(args.max_num_batched_tokens)
        raise RuntimeError("stop here")
    monkeypatch.setattr(engine_module, "build_engine", build)
    with pytest.raises(RuntimeError, match="stop here"):
        run_cli("bench", "latency", *flags)
    assert seen == [budget]
