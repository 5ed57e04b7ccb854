"""CPU checks of the skinny GEMM's host side (no GPU): blas.linear's choice of it, its launch against the kernel's
PTX parameters (two 128-byte tensor maps first), the by-value marshalling of pdl.launch and the tensor-map encoding
call as cuda.h declares it."""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("cupy")
from openinfer.kernels.cuda import blas, module, pdl, skinny_gemm, tma  # noqa: E402
from openinfer.testing.launch_check import FAKE_CP, aligned_empty, record_launches  # noqa: E402

BF16 = module.BF16


@pytest.fixture
def launches(monkeypatch):
    recorded = record_launches(monkeypatch, (blas, module, skinny_gemm))
    monkeypatch.setattr(skinny_gemm, "MODE", "1")
    monkeypatch.setattr(skinny_gemm, "hopper", lambda: True)
    monkeypatch.setattr(skinny_gemm, "sm_count", lambda: 132)
    monkeypatch.setattr(skinny_gemm, "max_active_clusters", lambda *a: 132 // a[-1])   # a GPC holds them all
    monkeypatch.setattr(blas, "gemv_resident", lambda name: 4 * 132)
    monkeypatch.setattr(blas, "clusters_supported", lambda: True)
    return recorded


@pytest.fixture
def maps(monkeypatch):
    """The tensor maps asked for (matrix_map's arguments); each answered by a blank 128-byte parameter."""
    asked = []
    monkeypatch.setattr(tma, "matrix_map", lambda *a: (asked.append(a), pdl.ByValue(128, align=64))[1])
    return asked


@pytest.mark.parametrize("m,n,k,splits", [(9, 2560, 4096, 6), (32, 6144, 2560, 2), (128, 19456, 2560, 1),
                                           (64, 200, 104, 1), (17, 2560, 9728, 6)])
def test_linear_launches_the_skinny_gemm(launches, maps, m, n, k, splits):
    x, w = aligned_empty((m, k), BF16), aligned_empty((n, k), BF16)
    out = blas.linear(x, w)
    (call,) = launches
    mp = skinny_gemm.width(m)
    assert (call.source, call.name, call.block) == ("skinny_gemm", f"skinny_gemm_bf16_n{mp}", 384)
    assert call.grid == (-(-n // 128), splits) and call.cluster == ((1, splits, 1) if splits > 1 else None)
    assert call.smem == skinny_gemm.smem_bytes(mp)
    assert call.args[2].data.ptr == out.data.ptr and [int(a) for a in call.args[3:]] == [n, m, n, -(-k // 64)]
    (wmap, xmap) = maps
    assert wmap == (w.data.ptr, n, k, 2 * k, 128) and xmap == (x.data.ptr, m, k, 2 * k, mp)


def test_other_cases_keep_their_paths(launches, maps, monkeypatch):
    """8 rows: the GEMV; 129 rows, a misaligned x, or the switch off: no skinny launch (cuBLAS(Lt), not recorded)."""
    monkeypatch.setattr(blas.lt, "run", lambda *a: True)   # stands in for cuBLASLt
    monkeypatch.setattr(blas, "cp", SimpleNamespace(**vars(FAKE_CP), cuda=SimpleNamespace(
        Device=lambda: SimpleNamespace(id=0))))
    w = aligned_empty((256, 512), BF16)
    blas.linear(aligned_empty((8, 512), BF16), w)
    assert [c.source for c in launches] == ["gemv"]
    blas.linear(aligned_empty((129, 512), BF16), w)
    blas.linear(aligned_empty((16, 520), BF16)[:, 3:515], w)
    monkeypatch.setattr(skinny_gemm, "MODE", "0")
    blas.linear(aligned_empty((16, 512), BF16), w)
    assert len(launches) == 1


def test_splits_are_capped_by_the_stages(launches, maps):
    x, w = aligned_empty((32, 128), BF16), aligned_empty((256, 128), BF16)
    skinny_gemm.gemm(x, w, aligned_empty((32, 256), BF16), splits=8)   # two 64-k stages: at most two splits
    assert launches[-1].grid == (2, 2) and launches[-1].cluster == (1, 2, 1)


def test_by_value_parameters_reach_the_driver(monkeypatch):
    """pdl.launch passes a ByValue from its own bytes and the other arguments from their 8-byte slots, then points
    the slot back for the next launch."""
    seen = []

    def launch_ex(cfg, fn, params, extra):
        sizes = (128, 128, 8, 4) if not seen else (8, 8, 8)
        seen.append([ctypes.string_at(params[i], n) for i, n in enumerate(sizes)])
        return 0
    monkeypatch.setattr(pdl, "driver", lambda: SimpleNamespace(cuLaunchKernelEx=launch_ex))
    monkeypatch.setattr(pdl, "cp", SimpleNamespace(cuda=SimpleNamespace(
        get_current_stream=lambda: SimpleNamespace(ptr=7))))
    a, b = pdl.ByValue(128, align=64), pdl.ByValue(128, align=64)
    assert a.address % 64 == 0
    ctypes.memmove(a.address, bytes(range(128)), 128)
    ctypes.memmove(b.address, bytes(range(128, 256)), 128)
    pdl.launch(1, (4, 2), 384, (a, b, np.int64(-5), np.int32(9)), 1000, pdl_on=False, cluster=(1, 2, 1))
    assert seen[0] == [bytes(range(128)), bytes(range(128, 256)), np.int64(-5).tobytes(), np.int32(9).tobytes()]
    pdl.launch(1, (4, 1), 128, (np.int64(1), np.int64(2), np.int64(3)), 0, pdl_on=True)
    assert seen[1] == [np.int64(v).tobytes() for v in (1, 2, 3)]
    slots = pdl._slots
    assert [slots.params[i] for i in range(3)] == [ctypes.addressof(slots.buf) + 8 * i for i in range(3)]


def test_tensor_map_encoding_call(monkeypatch):
    """cuTensorMapEncodeTiled(map, BFLOAT16 = 9, rank 2, address, {cols, rows}, {row stride}, {64, box rows},
    {1, 1}, interleave none, 128-byte swizzle = 3, L2 promotion 256 B = 3, zero fill), once per key."""
    calls = []

    def encode(m, dtype, rank, ptr, dims, strides, box, steps, *modes):
        calls.append((m % 64, dtype, rank, ptr, list(dims[:2]), strides[0], list(box[:2]), list(steps[:2]), modes))
        return 0
    monkeypatch.setattr(pdl, "driver", lambda: SimpleNamespace(cuTensorMapEncodeTiled=encode))
    monkeypatch.setattr(tma, "_maps", {})
    first = tma.matrix_map(4096, 100, 2560, 5120, 32)
    assert tma.matrix_map(4096, 100, 2560, 5120, 32) is first
    assert calls == [(0, 9, 2, 4096, [2560, 100], 5120, [64, 32], [1, 1], (0, 3, 3, 0))]
    assert tma.check_operand(4096, 5120) and not tma.check_operand(4098, 5120) and not tma.check_operand(4096, 5122)
    monkeypatch.setattr(pdl, "driver", lambda: SimpleNamespace(cuTensorMapEncodeTiled=lambda *a: 1))
    with pytest.raises(RuntimeError, match="OPENINFER_SKINNY_GEMM=0"):
        tma.matrix_map(8192, 1, 64, 128, 16)


def test_driver_binds_tensor_map_encoding():
    """The argument list bound in pdl.driver() is cuda.h's: 8 pointers / integers then 4 enums."""
    import inspect
    src = inspect.getsource(pdl.driver)
    assert "cuTensorMapEncodeTiled.argtypes = [vp, ctypes.c_int, u32, vp, u64p, u64p, u32p, u32p] + [ctypes.c_int] * 4" \
        in src


def test_tune_mode_takes_the_kernel_only_where_chosen(launches, maps, monkeypatch):
    """OPENINFER_SKINNY_GEMM=tune: a width and weight whose timed choice is a factor run the kernel with it; choice 0
    (cuBLASLt was faster) or no choice stays off it."""
    monkeypatch.setattr(skinny_gemm, "MODE", "tune")
    monkeypatch.setattr(skinny_gemm, "cp", SimpleNamespace(**vars(FAKE_CP), cuda=SimpleNamespace(
        Device=lambda: SimpleNamespace(id=0))))
    monkeypatch.setattr(blas, "cp", skinny_gemm.cp)
    monkeypatch.setattr(blas.lt, "run", lambda *a: True)   # stands in for cuBLASLt
    monkeypatch.setattr(skinny_gemm, "split_choice", {(0, 32, 2560, 4096): (3, 1), (0, 64, 2560, 4096): (0, 1)})
    w = aligned_empty((2560, 4096), BF16)
    for m in (24, 32, 40, 128):
        blas.linear(aligned_empty((m, 4096), BF16), w)
    assert [(c.name, c.grid) for c in launches] == [("skinny_gemm_bf16_n32", (20, 3))] * 2


def test_up_to_8_rows_only_where_timing_chose_it(launches, maps, monkeypatch):
    """Up to 8 rows the GEMV runs (MODE "1" included) unless the tuner chose the width-8 kernel for the weight; then
    linear and linear_silu_mul both take it (the same sums before the SiLU)."""
    monkeypatch.setattr(skinny_gemm, "cp", SimpleNamespace(**vars(FAKE_CP), cuda=SimpleNamespace(
        Device=lambda: SimpleNamespace(id=0))))
    monkeypatch.setattr(blas, "cp", skinny_gemm.cp)
    w = aligned_empty((19456, 2560), BF16)
    blas.linear(aligned_empty((1, 2560), BF16), w)
    assert [c.source for c in launches] == ["gemv"]
    monkeypatch.setattr(skinny_gemm, "split_choice", {(0, 8, 19456, 2560): (5, 2)})
    for mode in ("tune", "1"):
        monkeypatch.setattr(skinny_gemm, "MODE", mode)
        blas.linear(aligned_empty((1, 2560), BF16), w)
        blas.linear_silu_mul(aligned_empty((8, 2560), BF16), w)
    assert [(c.name, c.grid, c.smem) for c in launches[1:]] == [
        ("skinny_gemm_bf16_n8_x2", (152, 5), skinny_gemm.smem_bytes(8, 2)),
        ("skinny_gemm_silu_bf16_n8_x2", (152, 5), skinny_gemm.smem_bytes(8, 2))] * 2


def test_tuner_widths_and_choice():
    from openinfer.kernels.cuda import skinny_tune
    from openinfer.backends.cuda_graphs import buckets
    assert skinny_tune.widths(buckets(256)) == {8: 1, 16: 16, 32: 32, 64: 64, 128: 128}
    assert skinny_tune.widths(buckets(100)) == {8: 1, 16: 16, 32: 32, 64: 64, 128: 100}
    assert skinny_tune.widths([4, 2, 8]) == {8: 2} and skinny_tune.widths([200]) == {}
    assert skinny_tune.choose(10.0, {(1, 1): 11.0, (2, 1): 9.6, (3, 2): 9.8}) == (2, 1)
    assert skinny_tune.choose(10.0, {(1, 1): 11.0, (2, 2): 9.8}) == (0, 1)    # within 3 %: cuBLASLt stays


def test_tuner_times_once_and_reads_the_cache(monkeypatch, tmp_path):
    from openinfer.kernels.cuda import skinny_tune
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(skinny_gemm, "MODE", "tune")
    monkeypatch.setattr(skinny_gemm, "hopper", lambda: True)
    monkeypatch.setattr(skinny_gemm, "split_choice", {})

    class Stream:
        def __enter__(self): return self
        def __exit__(self, *a): return False
        def synchronize(self): pass
    monkeypatch.setattr(skinny_tune, "cp", SimpleNamespace(cuda=SimpleNamespace(
        Device=lambda: SimpleNamespace(id=0), Stream=lambda **kw: Stream())))
    monkeypatch.setattr(skinny_tune, "gpu_key", lambda dev: {"gpu": "H200", "cc": "9.0", "sms": 132})
    monkeypatch.setattr(skinny_tune, "compile_source", lambda *a: tmp_path / "skinny_gemm-sm_90a-abc.cubin")
    timed = []

    def fake_times(m, n, k, stream):   # the kernel wins on N = 2560 (2 splits), cuBLASLt on the rest
        timed.append((m, n, k))
        return 10.0, ({(1, 1): 9.0, (2, 2): 8.0} if n == 2560 else {(1, 1): 12.0})
    monkeypatch.setattr(skinny_tune, "time_choices", fake_times)
    shapes = {(2560, 4096), (6144, 2560)}
    got = skinny_tune.tune([1, 4, 16, 24, 32], shapes)
    assert (got.cached, got.timed) == (0, 6) and sorted(timed) == [(1, 2560, 4096), (1, 6144, 2560),
                                                                    (16, 2560, 4096), (16, 6144, 2560),
                                                                    (32, 2560, 4096), (32, 6144, 2560)]
    assert skinny_gemm.split_choice == {(0, w, 2560, 4096): (2, 2) for w in (8, 16, 32)} | {
        (0, w, 6144, 2560): (0, 1) for w in (8, 16, 32)}
    assert got.chosen == ("8:2560x4096/2x2", "16:2560x4096/2x2", "32:2560x4096/2x2")
    skinny_gemm.split_choice.clear()
    again = skinny_tune.tune([4, 16, 24, 32], shapes)
    assert (again.cached, again.timed, len(timed)) == (6, 0, 6) and len(skinny_gemm.split_choice) == 6
    monkeypatch.setattr(skinny_gemm, "MODE", "0")
    assert skinny_tune.tune([16], shapes) == skinny_tune.Tuned(0, 0)


@pytest.mark.parametrize("m,inter,k,splits", [(32, 9728, 2560, 1), (16, 1000, 4096, 8), (128, 64, 256, 1)])
def test_linear_silu_mul_launches_the_silu_epilogue(launches, maps, m, inter, k, splits):
    x, w = aligned_empty((m, k), BF16), aligned_empty((2 * inter, k), BF16)
    out = blas.linear_silu_mul(x, w)
    (call,) = launches
    mp = skinny_gemm.width(m)
    assert out.shape == (m, inter) and call.name == f"skinny_gemm_silu_bf16_n{mp}"
    assert call.grid == (-(-inter // 64), splits) and [int(a) for a in call.args[3:]] == [inter, m, inter, -(-k // 64)]
    assert maps == [(w.data.ptr, 2 * inter, k, 2 * k, 64), (x.data.ptr, m, k, 2 * k, mp)]
    assert blas.linear_silu_mul(x, aligned_empty((7, k), BF16)) is None   # no [gate; up] halves


def test_rule_splits_ask_how_many_clusters_fit(launches, maps, monkeypatch):
    """o (N 2560: 20 tiles) would split 6 ways; where the device holds only 16 clusters of 6 at once it takes 5."""
    asked = []
    monkeypatch.setattr(skinny_gemm, "max_active_clusters",
                        lambda src, name, threads, smem, c: asked.append((name, threads, smem, c)) or (16 if c == 6 else 24))
    blas.linear(aligned_empty((32, 4096), BF16), aligned_empty((2560, 4096), BF16))
    assert launches[-1].grid == (20, 5) and launches[-1].cluster == (1, 5, 1)
    assert asked == [("skinny_gemm_bf16_n32", 384, skinny_gemm.smem_bytes(32), 6),
                     ("skinny_gemm_bf16_n32", 384, skinny_gemm.smem_bytes(32), 5)]


def test_the_benchmark_script_imports_and_parses(monkeypatch, capsys):
    """scripts/skinny_bench.py loads without a GPU and says so when the device is not an H100 / H200 (a broken
    import there would cost a device run)."""
    import sys
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import skinny_bench
    monkeypatch.setattr(skinny_bench.skinny_gemm, "hopper", lambda: False)
    monkeypatch.setattr(sys, "argv", ["skinny_bench.py", "--smoke"])
    with pytest.raises(SystemExit, match="H100 / H200"):
        skinny_bench.main()
    assert callable(skinny_bench.smoke) and skinny_bench.SHAPES_4B["o"] == (4096, 2560)


def test_two_ctas_a_sm_variant(launches, maps):
    """The _x2 kernels: half the stages (two CTAs share an SM's shared memory), up to width 64 only."""
    assert [skinny_gemm.stages(mp, 2) for mp in (8, 16, 32, 64)] == [5, 5, 5, 4]
    assert all(2 * skinny_gemm.smem_bytes(mp, 2) <= 226 * 1024 for mp in (8, 16, 32, 64))
    assert skinny_gemm.variants(64) == (1, 2) and skinny_gemm.variants(128) == (1,)
    x, w = aligned_empty((40, 2560), BF16), aligned_empty((19456, 2560), BF16)
    skinny_gemm.gemm(x, w, aligned_empty((40, 19456), BF16), splits=2, per_sm=2)
    assert (launches[-1].name, launches[-1].smem) == ("skinny_gemm_bf16_n64_x2", skinny_gemm.smem_bytes(64, 2))
    with pytest.raises(ValueError, match="no kernel for 2 CTAs"):
        skinny_gemm.gemm(aligned_empty((100, 2560), BF16), w, aligned_empty((100, 19456), BF16), per_sm=2, splits=1)


def test_the_benchmark_table_on_stand_ins(monkeypatch, capsys):
    """skinny_bench.shape_rows on stand-in timings: a row per variant, the best (split, CTAs a SM) and the rule's."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import skinny_bench
    monkeypatch.setattr(skinny_bench, "SHAPES_4B", {"o": (4096, 2560)})
    monkeypatch.setattr(skinny_bench, "SHAPES_35", {})
    monkeypatch.setattr(skinny_bench, "max_rel_error", lambda m, n, k: 1e-3)
    monkeypatch.setattr(skinny_bench.skinny_gemm, "rule_splits", lambda n, k, mp: 6)
    monkeypatch.setattr(skinny_bench.skinny_tune, "time_choices", lambda m, n, k, stream: (
        10.0, {(s, p): 12.0 - s + p * (m == 1) for p in skinny_gemm.variants(skinny_gemm.width(m)) for s in range(1, 9)}))
    rows = skinny_bench.shape_rows([1, 128], None)
    assert [(r["m"], r["rule"], r["best"]) for r in rows] == [(1, [6, 1], [8, 1]), (128, [6, 1], [8, 1])]
    assert rows[0]["us"]["3,2"] == 11.0 and "3,2" not in rows[1]["us"]
    out = capsys.readouterr().out
    assert out.count("1/SM") == 2 and out.count("2/SM") == 1
