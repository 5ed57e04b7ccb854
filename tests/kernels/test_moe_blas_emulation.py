"""CPU emulation of moe_blas.py's cuBLAS path (no GPU): its launches run as they are recorded (fake_device.py; the
path reads moe_align's tile list back mid-way), cublasGemmEx is a numpy GEMM on the memory its pointers and leading
dimensions address (column-major, as cuBLAS reads them), against the numpy reference; and the rule that picks it."""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from fake_device import flat, run
from openinfer.kernels.cuda import blas, moe, moe_blas, ops
from openinfer.kernels.cuda.module import BF16
from openinfer.kernels.numpy_mla_moe import moe_experts as ref_moe_experts
from openinfer.testing.launch_check import aligned_empty, fake, record_launches
from test_moe_emulation import kernels as moe_kernels
from test_moe_wgmma_emulation import emulate_gemm as emulate_wgmma

CUDA_TYPES = {14: BF16, 0: np.dtype(np.float32)}   # cudaDataType_t


def _matrix(ptr: int, dtype: np.dtype, rows: int, cols: int, ld: int) -> np.ndarray:
    """rows x cols elements at ptr, row r starting ld elements after row r - 1 (writable)."""
    n = (rows - 1) * ld + cols
    buf = (ctypes.c_char * (n * dtype.itemsize)).from_address(ptr)
    return np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype, n), (rows, cols), (ld * dtype.itemsize,
                                                                                         dtype.itemsize))


class FakeCublas:
    """cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc,
    compute, algo) in numpy: column-major C[m, n] = op_T(A) @ op_N(B), A stored k x m, B k x n."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []   # (m, n, k) of each call
        self.compute = True

    def cublasGemmEx(self, handle, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, compute, algo):
        assert (ta, tb, compute, at, bt) == (1, 0, 68, 14, 14) and min(m, n, k) > 0
        assert ctypes.c_float.from_address(alpha).value == 1 and ctypes.c_float.from_address(beta).value == 0
        self.calls.append((m, n, k))
        if not self.compute:   # zeros, so what reads C next computes on numbers, not on uninitialised memory
            _matrix(c, CUDA_TYPES[ct], n, m, ldc)[...] = 0
            return 0
        w = _matrix(a, BF16, m, k, lda).astype(np.float32)      # op_T(A): row i of w is A's column i
        x = _matrix(b, BF16, n, k, ldb).astype(np.float32)      # B's columns are x's rows
        _matrix(c, CUDA_TYPES[ct], n, m, ldc)[...] = x @ w.T    # C's columns are the output rows
        return 0


def emulate_gather(call):
    """gather_rows_u{unit}: whole rows of `units` units of `unit` bytes."""
    src, stride, rows, out, units = call.args
    unit = int(call.name.rsplit("_u", 1)[1])
    s, d, width = flat(src).view(np.uint8), flat(out).view(np.uint8), int(units) * unit
    for r in range(call.grid[0]):
        at = int(flat(rows)[r]) * int(stride) * unit
        d[r * width: (r + 1) * width] = s[at: at + width]


def emulate_silu_mul(call):
    gate_up, stride, out, inter = call.args
    g, o, inter = flat(gate_up).astype(np.float32), flat(out), int(inter)
    for r in range(call.grid[0]):
        gate, up = g[r * int(stride):][:inter], g[r * int(stride) + inter:][:inter]
        o[r * inter: (r + 1) * inter] = gate / (1 + np.exp(-gate)) * up


@pytest.fixture(params=[False, True], ids=["mma", "sm90"])
def device(monkeypatch, request):
    """Launches checked and emulated at once, the fake cuBLAS, and no graph capturing; on an sm_90 device or not
    (the grouped GEMMs' wide tiles on warpgroup MMA or on mma.sync)."""
    recorded = record_launches(monkeypatch, (moe, moe_blas, ops, blas))
    monkeypatch.setattr(moe_blas, "hopper", lambda: request.param)
    rng = np.random.default_rng(0)
    table = {**moe_kernels(rng), "moe_gate_up_bf16_wgmma": emulate_wgmma, "moe_down_bf16_wgmma": emulate_wgmma,
             "gather_rows": emulate_gather, "silu_mul": emulate_silu_mul}
    checked = moe.launch

    def launch_now(*args, **kw):
        checked(*args, **kw)
        run(recorded[-1:], table)
    for mod in (moe, ops):
        monkeypatch.setattr(mod, "launch", launch_now)
    lib = FakeCublas()
    monkeypatch.setattr(blas, "_bound_handle", lambda: (SimpleNamespace(lib=lib), 1))
    monkeypatch.setattr(moe_blas, "_capturing", lambda: False)
    return SimpleNamespace(launches=recorded, cublas=lib)


def _inputs(T, D, I, E, k, ids, seed, addend=False):
    rng = np.random.default_rng(seed)
    wide = fake(rng.standard_normal((T, D + 8)), BF16)   # x a strided view, as a fused projection leaves it
    gate_up = fake(rng.standard_normal((E, 2 * I, D)) * D ** -0.5, BF16)
    down = fake(rng.standard_normal((E, D, I)) * I ** -0.5, BF16)
    weights = fake(rng.random((T, k)).astype(np.float32))
    add = fake(rng.standard_normal((T, D)), BF16) if addend else None
    return wide[:, 8:], gate_up, down, fake(np.asarray(ids, np.int32)), weights, add


def _reference(x, gate_up, down, ids, weights, offset, addend):
    f64 = [np.asarray(a, np.float64) for a in (x, gate_up, down)]
    return ref_moe_experts(*f64, np.asarray(ids), np.asarray(weights), offset,
                           None if addend is None else np.asarray(addend, np.float64))


def routing(case: str, T: int, k: int, n_ids: int, rng, never: int = -1) -> np.ndarray:
    """k distinct experts a token, never `never`: spread, or skewed (a geometric law: low experts loaded, high ones
    rarely or never), or every token on the same k experts (the others get no rows)."""
    experts = np.delete(np.arange(n_ids), never) if never >= 0 else np.arange(n_ids)
    n = len(experts)
    if case == "spread":
        return experts[np.argsort(rng.random((T, n)), axis=-1)[:, :k]]
    if case == "skewed":
        return experts[np.argsort(rng.random((T, n)) * np.geomspace(1, 1e4, n), axis=-1)[:, :k]]
    return np.tile(experts[:k], (T, 1))


# T, D, I, local experts, top-k, experts routed over, offset of the local ones; the shard's second expert unused
CASES = {"spread": (40, 72, 40, 4, 2, 4, 0), "skewed": (60, 64, 48, 6, 3, 6, 0),
         "same_experts": (20, 64, 32, 5, 2, 5, 0), "ep_shard_spread": (50, 64, 32, 3, 3, 9, 3)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_addend", [False, True])
def test_moe_experts_cublas_emulation(device, case, with_addend):
    """The cuBLAS path against numpy_mla_moe.moe_experts: uneven loads, experts with no rows, an expert-parallel
    shard; one GemmEx per projection of each expert that has rows, none for the others."""
    T, D, I, E, k, n_ids, offset = CASES[case]
    rng = np.random.default_rng(len(case))
    ids = routing(case.removeprefix("ep_shard_"), T, k, n_ids, rng, offset + 1 if offset else -1)
    x, gate_up, down, ids_d, weights, addend = _inputs(T, D, I, E, k, ids, len(case), with_addend)
    y = moe_blas.moe_experts_cublas(x, gate_up, down, ids_d, weights, offset, addend)
    local = ids.ravel() - offset
    counts = np.bincount(local[(local >= 0) & (local < E)], minlength=E)
    assert (counts == 0).any() != (case == "spread") and len(set(counts)) > 1   # empty experts, uneven loads
    rows = [int(c) for c in counts if c]
    assert device.cublas.calls == [(2 * I, m, D) for m in rows] + [(D, m, I) for m in rows]
    assert [c.name for c in device.launches] == ["moe_align", "gather_rows_u16", "silu_mul_v_bf16",
                                                 "moe_combine_bf16"]
    want = _reference(x, gate_up, down, ids_d, weights, offset, addend)
    np.testing.assert_allclose(np.asarray(y, np.float32), want, atol=2e-2, rtol=2e-2)


def test_no_local_rows(device):
    """A shard none of whose experts is chosen: no GEMM, the addend alone (zeros without one)."""
    ids = np.tile(np.arange(2), (6, 1))
    x, gate_up, down, ids_d, weights, addend = _inputs(6, 64, 32, 4, 2, ids, 1, True)
    y = moe_blas.moe_experts_cublas(x, gate_up, down, ids_d, weights, 4, addend)
    assert device.cublas.calls == []
    np.testing.assert_array_equal(np.asarray(y), np.asarray(addend))
    y = moe_blas.moe_experts_cublas(x, gate_up, down, ids_d, weights, 4)
    np.testing.assert_array_equal(np.asarray(y, np.float32), 0)


@pytest.mark.parametrize("T,capturing,cublas", [(64, False, True), (63, False, False), (64, True, False),
                                                 (200, True, False)])
def test_the_rule(device, monkeypatch, T, capturing, cublas):
    """T * k >= PREFILL_ROWS_PER_EXPERT * E_local outside a graph capture: cuBLAS; otherwise the grouped GEMMs
    (moe.moe_experts, all on the device). Both give the reference's output."""
    for name in ("PREFILL_ROWS_PER_EXPERT", "PREFILL_ROWS_PER_EXPERT_SM90"):
        monkeypatch.setattr(moe_blas, name, 32)
    monkeypatch.setattr(moe_blas, "_capturing", lambda: capturing)
    E, k, D, I = 4, 2, 64, 32   # 64 tokens x 2 = 32 rows x 4 experts
    ids = routing("skewed", T, k, E, np.random.default_rng(T))
    x, gate_up, down, ids_d, weights, _ = _inputs(T, D, I, E, k, ids, T)
    assert moe_blas.uses_cublas(T, k, E) == cublas
    y = moe_blas.moe_experts(x, gate_up, down, ids_d, weights, 0)
    assert bool(device.cublas.calls) == cublas
    assert any(c.name.startswith("moe_gate_up") for c in device.launches) != cublas
    np.testing.assert_allclose(np.asarray(y, np.float32), _reference(x, gate_up, down, ids_d, weights, 0, None),
                               atol=2e-2, rtol=2e-2)


def test_v2_lite_widths(device, monkeypatch):
    """At DeepSeek-V2-Lite's widths (D 2048, I 1408, 64 experts, top-6; 700 tokens, a skewed routing): the launches
    fit their kernels and sm_90's limits, each expert with rows gets its two GEMMs (not computed here)."""
    monkeypatch.setattr(device.cublas, "compute", False)
    T, D, I, E, k = 700, 2048, 1408, 64, 6
    ids = routing("skewed", T, k, E, np.random.default_rng(1))
    x, addend = fake(np.zeros((T, D)), BF16), fake(np.zeros((T, D)), BF16)
    gate_up, down = aligned_empty((E, 2 * I, D), BF16), aligned_empty((E, D, I), BF16)   # never read here
    ids_d, weights = fake(ids.astype(np.int32)), fake(np.ones((T, k), np.float32))
    y = moe_blas.moe_experts_cublas(x, gate_up, down, ids_d, weights, 0, addend)
    counts = np.bincount(ids.ravel(), minlength=E)
    assert y.shape == (T, D) and y.dtype == BF16 and (counts == 0).any()
    assert [call[:2] for call in device.cublas.calls] == [(2 * I, int(c)) for c in counts if c] + \
        [(D, int(c)) for c in counts if c]
    gather, silu = device.launches[1:3]
    assert gather.grid[0] == silu.grid[0] == T * k
