"""CPU checks of scripts/gemm_algos_bench.py (no GPU): the shape and M table, the 145-GEMM chain arithmetic and
a whole run on numpy stand-ins for the GPU calls. Its cuBLASLt bindings (lt.py) are checked in test_lt.py."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("cupy")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import gemm_algos_bench as bench  # noqa: E402
from openinfer.kernels.cuda import blas, lt  # noqa: E402

QWEN3_4B = {"qkv": (2560, 6144), "o": (4096, 2560), "gate_up": (2560, 19456), "down": (9728, 2560),
            "lm_head": (2560, 151936)}


def test_default_shapes_and_rows():
    args = bench.parse_args([])
    assert {s: bench.SHAPES_4B[s] for s in args.shapes} == QWEN3_4B   # (K, N)
    assert args.m == [16, 32, 64, 128, 256] and args.algos == 16 and args.output_json is None
    assert bench.parse_args(["--m", "32", "128", "--shapes", "down"]).m == [32, 128]


def test_chain_arithmetic():
    assert sum(bench.CHAIN_COUNTS.values()) == 145
    assert bench.chain_us({"qkv": 10.0, "o": 5.0, "gate_up": 30.0, "down": 15.0, "lm_head": 200.0}) == \
        36 * 60.0 + 200.0
    # 8.04 GB: the 1.87 ms floor at 4.3 TB/s of reference/gpu-notes.md
    assert bench.chain_weight_bytes(list(QWEN3_4B)) == 2 * (36 * (2560 * 6144 + 4096 * 2560 + 2560 * 19456 +
                                                                 9728 * 2560) + 2560 * 151936) == 8_044_544_000


TIMES = {"gemmex": 10.0, 0: 12.0, 2: 4.0, 3: 8.0, 5: 6.0}   # us per GEMM; algorithm 2 is fastest but wrong


class FakeLt:
    """Four heuristic results: #0 fine, #1 not usable (state), #2 wrong output, #3 fine and faster than GemmEx."""
    lib = SimpleNamespace(cublasLtGetVersion=lambda: 130802)
    last = None

    def heuristics(self, lay, count):
        results = [lt.HeuristicResult() for _ in range(4)]
        for i, r in enumerate(results):
            r.algo.data[0], r.workspace_size = i, 1 << 20
        results[1].state = 15   # CUBLAS_STATUS_NOT_SUPPORTED
        return results[:count]

    def matmul(self, algo, lay, x, w, y):
        FakeLt.last = algo.data[0]
        y[...] = (x.astype(np.float32) @ w.astype(np.float32).T + (algo.data[0] == 2)).astype(y.dtype)


def test_run_on_host_stand_ins(monkeypatch, tmp_path, capsys):
    def linear(x, w):
        FakeLt.last = "gemmex"
        return (x.astype(np.float32) @ w.astype(np.float32).T).astype(x.dtype)

    def graph_us(fn, reps):   # fn() returns one result per weight copy; measure() divides by their number
        return TIMES[FakeLt.last] * len(fn())
    rng = np.random.default_rng(0)
    fake_cp = SimpleNamespace(empty=np.empty, abs=np.abs, float32=np.float32, cuda=SimpleNamespace(
        Device=lambda: SimpleNamespace(id=0), runtime=SimpleNamespace(getDeviceProperties=lambda d: {"name": b"stub"})))
    monkeypatch.setattr(blas, "GEMV_ENABLED", True)   # main() turns it off; monkeypatch restores it
    monkeypatch.setattr(blas, "linear", linear)
    for name, value in (("cp", fake_cp), ("Lt", FakeLt), ("graph_us", graph_us), ("layouts", lambda *a: (None,) * 3),
                        ("rand", lambda *s, scale=1.0: (rng.standard_normal(s) * scale).astype(bench.bf)),
                        ("SHAPES_4B", {s: (16 * (i + 1), 8 * (i + 2)) for i, s in enumerate(QWEN3_4B)})):
        monkeypatch.setattr(bench, name, value)
    out = tmp_path / "algos.json"
    bench.main(["--m", "16", "32", "--algos", "4", "--output-json", str(out)])
    result = json.loads(out.read_text())
    assert len(result["rows"]) == 10 and not blas.GEMV_ENABLED
    for row in result["rows"]:
        assert [a["index"] for a in row["algos"]] == [0, 2, 3] and [s["index"] for s in row["skipped"]] == [1]
        assert [a["flagged"] for a in row["algos"]] == [False, True, False]
        assert (row["gemmex_us"], row["best_index"], row["best_us"]) == (10.0, 3, 8.0)
    assert [(c["m"], c["gemms"], c["gemmex_us"], c["best_lt_us"]) for c in result["chain"]] == \
        [(16, 145, 1450.0, 1160.0), (32, 145, 1450.0, 1160.0)]
    printed = capsys.readouterr().out
    assert "speed-up 1.250" in printed and "2/4" in printed
    def wide_candidates(lt_, lay):   # --wide: a duplicate of heuristic #3 (tried once) and #5, the fastest right one
        found = [lt.MatmulAlgo(), lt.MatmulAlgo()]
        found[0].data[0], found[1].data[0] = 3, 5
        return found
    monkeypatch.setattr(bench, "wide_candidates", wide_candidates)
    bench.main(["--m", "16", "--algos", "4", "--wide", "--output-json", str(out)])
    row = json.loads(out.read_text())["rows"][0]
    assert [a["index"] for a in row["algos"]] == [0, 2, 3, "w0"]   # the duplicate of #3 is not timed again
    assert (row["best_index"], row["best_us"], row["best_heuristic_us"]) == ("w0", 6.0, 8.0)
