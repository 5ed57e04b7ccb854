"""cuBLASLt matmul with, per (M, N, K), the fastest of cuBLASLt's heuristic algorithms chosen by timing.

cublasGemmEx (blas.linear above GEMV_MAX_M rows) runs cuBLAS's first heuristic; on the H200 the fastest of cuBLASLt's
top 16 beats it by 5-12 % at M = 16..64 for Qwen3-4B's decode GEMMs, and no candidate beyond the heuristic's top 16
beat its best at M = 32 or 128. `tune` times those candidates once per shape at start-up, outside graph capture (eager
and graph decode then run the same algorithm: the same bits), and keeps the winners' opaque 64 bytes in the on-disk
cache, keyed by GPU, SM count and cuBLASLt version; a warm start only checks them (cublasLtMatmulAlgoCheck). `run` is
blas.linear's path for a tuned bf16 shape. Descriptors are made once per shape and the workspace is preallocated, so
capture never allocates. Row-major y[M, N] = x[M, K] @ w[N, K].T is, column-major, y^T = op_T(w) @ op_N(x^T), as for
GemmEx. Signatures and enum values: cublasLt.h of nvidia-cublas 13.
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import cupy as cp

from . import blas

DESC_TRANSA, DESC_TRANSB = 3, 4     # cublasLtMatmulDescAttributes_t CUBLASLT_MATMUL_DESC_TRANSA/B, int32_t values
PREF_SEARCH_MODE, PREF_MAX_WORKSPACE_BYTES = 0, 1   # cublasLtMatmulPreferenceAttributes_t (uint32_t, uint64_t)
ALIGN = 256                         # the heuristic's default pointer alignment (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*)


class MatmulAlgo(ctypes.Structure):
    """cublasLtMatmulAlgo_t: typedef struct { uint64_t data[8]; } -- opaque, 64 bytes."""
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t: { cublasLtMatmulAlgo_t algo; size_t workspaceSize; cublasStatus_t state;
    float wavesCount; int reserved[4]; } -- 96 bytes."""
    _fields_ = [("algo", MatmulAlgo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def load_lt() -> ctypes.CDLL:
    """libcublasLt with the prototypes of cublasLt.h (handles and descriptors are opaque pointers, enums int)."""
    lib = blas.load_cublas("cublasLt")
    vp, i32, ptr = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER
    for name, argtypes in {
        "cublasLtCreate": [ptr(vp)],
        "cublasLtMatmulDescCreate": [ptr(vp), i32, i32],            # (desc*, cublasComputeType_t, scaleType)
        "cublasLtMatmulDescSetAttribute": [vp, i32, vp, ctypes.c_size_t],
        # (layout*, cudaDataType, uint64_t rows, uint64_t cols, int64_t ld)
        "cublasLtMatrixLayoutCreate": [ptr(vp), i32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
        "cublasLtMatmulPreferenceCreate": [ptr(vp)],
        "cublasLtMatmulPreferenceSetAttribute": [vp, i32, vp, ctypes.c_size_t],
        "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i32, ptr(HeuristicResult), ptr(i32)],
        # (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, const algo*, result*)
        "cublasLtMatmulAlgoCheck": [vp] * 6 + [ptr(MatmulAlgo), ptr(HeuristicResult)],
        # (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo*, workspace, bytes, stream)
        "cublasLtMatmul": [vp] * 12 + [ptr(MatmulAlgo), vp, ctypes.c_size_t, vp],
        # (handle, computeType, scaleType, Atype, Btype, Ctype, Dtype, requested, int ids[], int* returned)
        "cublasLtMatmulAlgoGetIds": [vp] + [i32] * 7 + [ptr(i32), ptr(i32)],
        "cublasLtMatmulAlgoInit": [vp] + [i32] * 7 + [ptr(MatmulAlgo)],   # (..., int algoId, algo*)
        "cublasLtMatmulAlgoCapGetAttribute": [ptr(MatmulAlgo), i32, vp, ctypes.c_size_t, ptr(ctypes.c_size_t)],
        "cublasLtMatmulAlgoConfigSetAttribute": [ptr(MatmulAlgo), i32, vp, ctypes.c_size_t],
    }.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, i32
    lib.cublasLtGetVersion.argtypes, lib.cublasLtGetVersion.restype = [], ctypes.c_size_t
    return lib


def matmul_desc(lib: ctypes.CDLL) -> ctypes.c_void_p:
    """fp32 compute and alpha/beta, A = w transposed, B = x^T as is (host calls: no GPU needed)."""
    desc = ctypes.c_void_p()
    blas._check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), blas._COMPUTE_32F, blas._CUDA_R_32F),
                "LtMatmulDescCreate")
    for attr, op in ((DESC_TRANSA, blas._OP_T), (DESC_TRANSB, blas._OP_N)):
        value = ctypes.c_int32(op)
        blas._check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value), ctypes.sizeof(value)),
                    "LtMatmulDescSetAttribute")
    return desc


def preference(lib: ctypes.CDLL, search_mode: int = 0) -> ctypes.c_void_p:
    """Heuristic search limited to algorithms whose workspace fits blas.WORKSPACE_BYTES (search_mode 0: the best
    fits over every algorithm; 1, CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID: configurations of the algorithm id given)."""
    pref, limit, mode = ctypes.c_void_p(), ctypes.c_uint64(blas.WORKSPACE_BYTES), ctypes.c_uint32(search_mode)
    blas._check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "LtMatmulPreferenceCreate")
    for attr, value in ((PREF_MAX_WORKSPACE_BYTES, limit), (PREF_SEARCH_MODE, mode)):
        blas._check(lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(value), ctypes.sizeof(value)),
                    "LtMatmulPreferenceSetAttribute")
    return pref


def layouts(lib: ctypes.CDLL, m: int, n: int, k: int) -> tuple[ctypes.c_void_p, ...]:
    """Column-major bf16 layouts as stored: w[N, K] is K x N (ld K; op_T makes it N x K), x[M, K] is K x M
    (ld K), y[M, N] is N x M (ld N) for both C and D. A few host structs a shape, kept for the process."""
    out = []
    for rows, cols in ((k, n), (k, m), (n, m)):
        layout = ctypes.c_void_p()
        blas._check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), blas._CUDA_R_16BF, rows, cols, rows),
                    "LtMatrixLayoutCreate")
        out.append(layout)
    return tuple(out)


class Lt:
    """A cuBLASLt handle with the one matmul descriptor and the heuristic preference; a matmul uses the current
    lane's workspace (blas.workspace)."""

    def __init__(self) -> None:
        self.lib = load_lt()
        self.handle = ctypes.c_void_p()
        blas._check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "LtCreate")
        self.desc, self.pref = matmul_desc(self.lib), preference(self.lib)

    def heuristics(self, lay: tuple[ctypes.c_void_p, ...], count: int) -> list[HeuristicResult]:
        """Up to `count` algorithms, cuBLASLt's best guess first; each has its own state (0 = usable)."""
        a, b, c = lay
        results, returned = (HeuristicResult * count)(), ctypes.c_int(0)
        status = self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, a, b, c, c, self.pref, count,
                                                         results, ctypes.byref(returned))
        blas._check(status, "LtMatmulAlgoGetHeuristic")
        return list(results[:returned.value])

    def usable(self, algo: MatmulAlgo, lay: tuple[ctypes.c_void_p, ...]) -> bool:
        """Whether this library on this GPU runs `algo` for these layouts within the workspace (host call)."""
        a, b, c = lay
        result = HeuristicResult()
        status = self.lib.cublasLtMatmulAlgoCheck(self.handle, self.desc, a, b, c, c, ctypes.byref(algo),
                                                  ctypes.byref(result))
        return status == 0 and result.workspace_size <= blas.WORKSPACE_BYTES

    def matmul(self, algo: MatmulAlgo, lay: tuple[ctypes.c_void_p, ...], x: cp.ndarray, w: cp.ndarray,
               y: cp.ndarray) -> None:
        """y = x @ w.T on the current stream (graph-capturable: the workspace is preallocated)."""
        a, b, c = lay
        blas._check(self.lib.cublasLtMatmul(
            self.handle, self.desc, ctypes.addressof(blas._ONE), w.data.ptr, a, x.data.ptr, b,
            ctypes.addressof(blas._ZERO), y.data.ptr, c, y.data.ptr, c, ctypes.byref(algo),
            blas.workspace().data.ptr, blas.WORKSPACE_BYTES, cp.cuda.get_current_stream().ptr), "LtMatmul")


@dataclass(frozen=True)
class Plan:
    """A tuned shape: its algorithm and its layouts, made once."""
    lt: Lt
    algo: MatmulAlgo
    lay: tuple[ctypes.c_void_p, ...]


plans: dict[tuple[int, int, int, int], Plan] = {}   # (device, M, N, K) -> its plan; filled by lt_tune.tune
recorded: set[tuple[int, int]] | None = None         # while not None, blas.linear adds each bf16 (N, K) it sees


@contextmanager
def recording() -> Iterator[set[tuple[int, int]]]:
    """The (N, K) of the bf16 packed-row weights blas.linear is called with inside the block: the shapes
    worth tuning are those the model really multiplies by (loading/loader.py records them in its activation profile)."""
    global recorded
    recorded = shapes = set()
    try:
        yield shapes
    finally:
        recorded = None


def run(dev: int, x2: cp.ndarray, w: cp.ndarray, out2: cp.ndarray) -> bool:
    """out2 = x2 @ w.T through the tuned algorithm if (M, N, K) has one and the operands are packed rows
    aligned as the heuristic assumed; False (nothing done) otherwise: blas.linear runs GemmEx then."""
    (m, k), n = x2.shape, w.shape[0]
    plan = plans.get((dev, m, n, k)) if plans else None
    if plan is None or x2.strides[0] != 2 * k or w.strides[0] != 2 * k or \
            (x2.data.ptr | w.data.ptr | out2.data.ptr) % ALIGN:
        return False
    plan.lt.matmul(plan.algo, plan.lay, x2, w, out2)
    return True
