"""CPU checks of the GEMV's split-K tuning (kernels/cuda/gemv_tune.py; no GPU): the candidates a weight allows, the
choice (the fastest, unless the rule's own factor is within the tolerance), the cache file and its key, a warm start
timing nothing, and that blas launches the chosen factor for the plain and the SiLU GEMV --
with fakes for the timer and the device."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("cupy")
from openinfer.kernels.cuda import blas, gemv_tune  # noqa: E402

KEY = {"gpu": "fake", "cc": "9.0", "sms": 132, "sources": "0" * 16}
QKV, GATE_UP, DOWN = (6144, 2560), (19456, 2560), (2560, 9728)
# µs by factor: qkv fastest unsplit (the rule says 2), gate_up 5 % faster at 5, down 1 % faster at 2 (noise: kept)
TIMES = {QKV: {1: 9.9, 2: 13.5, 3: 14.5, 4: 14.4, 5: 12.3, 6: 14.8, 8: 16.2},
         GATE_UP: {1: 41.5, 2: 40.0, 3: 41.0, 4: 41.0, 5: 39.4, 6: 41.0, 8: 43.0},
         DOWN: {1: 26.0, 2: 17.8, 3: 18.9, 4: 18.0, 5: 20.4, 6: 23.1, 8: 20.2}}


@pytest.fixture
def tuning(monkeypatch, tmp_path):
    """gemv_tune on fakes: 6 CTAs an SM on 132 SMs (the H200 u4 kernel), the TIMES table as the timer (calls recorded), a fresh choice
    table and cache folder."""
    timed = []

    def time_splits(n, k, factors, dev, stream):
        timed.append(((n, k), factors))
        return [TIMES[(n, k)][s] for s in factors]
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemv_tune, "time_splits", time_splits)
    monkeypatch.setattr(gemv_tune, "device_key", lambda dev: KEY)
    monkeypatch.setattr(gemv_tune.cp, "cuda", type("cuda", (), {"Device": lambda: type("d", (), {"id": 0}),
                                                                 "Stream": lambda non_blocking: _Stream()}))
    monkeypatch.setattr(blas, "gemv_resident", lambda name: 6 * 132)
    monkeypatch.setattr(blas, "gemv_split_choice", {})
    return timed


class _Stream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


def test_candidates_start_with_the_rule_and_respect_the_weight():
    assert gemv_tune.candidates(2560, 9728, 4) == [4, 1, 2, 3, 5, 6, 8]
    assert gemv_tune.candidates(2560, 512, 1) == [1, 2, 3, 4]                 # 64 chunks: at most 4 splits of 16
    assert gemv_tune.candidates(16 * 5000, 4096, 1) == [1, 2, 3, 4, 5, 6, 8]   # any tile count splits (a cluster a tile)
    assert max(gemv_tune.CANDIDATES) <= blas.GEMV_MAX_SPLITS                   # ... of at most 8 CTAs


def test_tune_keeps_the_fastest_unless_the_rule_is_as_good(tuning, tmp_path):
    got = gemv_tune.tune({QKV, GATE_UP, DOWN, (64, 36)})   # K % 8 != 0: not a GEMV shape
    assert got == gemv_tune.Tuned(cached=0, timed=3, changes=("6144x2560 2->1", "19456x2560 1->5"))
    assert blas.gemv_split_choice == {(0, *QKV): 1, (0, *GATE_UP): 5, (0, *DOWN): 4}
    assert [f[0] for _, f in tuning] == [blas.gemv_splits(n, k, 6 * 132) for n, k in sorted((QKV, GATE_UP, DOWN))]
    saved = json.loads(next((tmp_path / "gemv_splits").glob("*.json")).read_text())
    assert saved == {"key": KEY, "choices": {"6144,2560": 1, "19456,2560": 5, "2560,9728": 4}}


def test_a_warm_start_times_nothing(tuning):
    gemv_tune.tune({QKV, DOWN})
    blas.gemv_split_choice.clear()
    tuning.clear()
    assert gemv_tune.tune({QKV, DOWN, GATE_UP}) == gemv_tune.Tuned(cached=2, timed=1,
                                                                  changes=("6144x2560 2->1", "19456x2560 1->5"))
    assert [shape for shape, _ in tuning] == [GATE_UP]
    assert gemv_tune.tune({QKV}) == gemv_tune.Tuned(0, 0)   # chosen already in this process


def test_a_saved_factor_the_weight_cannot_take_is_timed_again(tuning, tmp_path):
    from openinfer.kernels.cuda import tuning as tuning_cache
    tuning_cache.write_choices(tuning_cache.cache_path("gemv_splits", KEY), KEY, {"6144,2560": 40, "2560,9728": 4})
    assert gemv_tune.tune({QKV, DOWN}) == gemv_tune.Tuned(cached=1, timed=1, changes=("6144x2560 2->1",))
    assert [shape for shape, _ in tuning] == [QKV]


def test_a_cache_of_another_key_or_unreadable_is_ignored(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"key": KEY, "choices": {"6144,2560": 1, "bad": 0, "worse": "2"}}))
    assert gemv_tune.saved_splits(path, KEY) == {"6144,2560": 1}
    assert gemv_tune.saved_splits(path, {**KEY, "sources": "1" * 16}) == {}   # the kernel changed: timed again
    path.write_text("{not json")
    assert gemv_tune.saved_splits(path, KEY) == {}


