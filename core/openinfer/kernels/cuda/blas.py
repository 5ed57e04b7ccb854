"""`linear`: a tensor-core GEMV kernel (gemv.cu) for bf16 with M <= 8 rows, cublasGemmEx otherwise.

The GEMV path (decode at small batch is weight-bandwidth bound, where cuBLAS reached ~72 % of HBM
bandwidth): bf16, 1..8 rows, K % 8 == 0, 16-byte aligned x/w rows (any row strides); split-K by a
factor per weight timed at start-up (gemv_tune.py; else one resident wave), the splits of a tile reduced in a thread-
block cluster (bit-deterministic, graph-safe). Under programmatic dependent launch
(pdl.py) its first weights are loaded while the previous kernel drains.
`gemv_silu_mul` is the same GEMV with SwiGLU's silu(gate) * up in its epilogue (ops.linear_silu_mul).

cuBLAS is called directly via ctypes.

CuPy's own cuBLAS wrappers refuse CUDA-graph capture; direct cublasGemmEx calls capture and
replay bit-identically. Four entry points are all we need, so they are
bound with ctypes rather than through a bindings package (nvmath-python loads every CUDA math
library at import and, with torch installed, torch too). One handle per device, bound to the
current stream at each call, with a preallocated workspace so capture never allocates; one handle and workspace per
lane (lanes.py), which cuBLASLt's calls (lt.py) share, so a graph replay and an eager forward never share one.
Row-major y[T, out] = x[T, in] @ w[out, in].T is, column-major, y^T = op_T(w) @ op_N(x^T).
"""
from __future__ import annotations

import ctypes
import sys
from typing import Any

import cupy as cp
import numpy as np

from . import lanes, lt
from .module import BF16, blocks_per_sm, clusters_supported, launch, sm_count

WORKSPACE_BYTES = 32 << 20
_CUDA_R_32F, _CUDA_R_16BF = 0, 14            # cudaDataType_t
_OP_N, _OP_T = 0, 1                           # cublasOperation_t
_COMPUTE_32F, _GEMM_DEFAULT = 68, -1          # cublasComputeType_t, cublasGemmAlgo_t
_DATA_TYPE = {BF16: _CUDA_R_16BF, np.dtype(np.float32): _CUDA_R_32F}
_ONE, _ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)   # host-pointer-mode alpha/beta
INSTALL_HINT = ("install nvidia-cublas (part of the cuda13 / cuda12 extra: pip install -e '.[cuda13]' in an openinfer "
                "checkout) or a CUDA toolkit")


def load_cublas(name: str = "cublas") -> ctypes.CDLL:
    """lib`name` ("cublas", or "cublasLt" for lt.py) from the NVIDIA wheels or the toolkit."""
    errors = []
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # finds pip-installed NVIDIA wheels too
        return ctypes.CDLL(load_nvidia_dynamic_lib(name).abs_path)
    except Exception as e:  # noqa: BLE001 — fall back to the loader's search path
        errors.append(str(e))
    for soname in (f"lib{name}.so.13", f"lib{name}.so.12", f"lib{name}.so"):
        try:
            return ctypes.CDLL(soname)
        except OSError as e:
            errors.append(str(e))
    raise RuntimeError(f"cannot load {name} ({'; '.join(errors)}); {INSTALL_HINT}")


def _bind(lib: ctypes.CDLL) -> None:
    vp, i32 = ctypes.c_void_p, ctypes.c_int
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasDestroy_v2.argtypes = [vp]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
    lib.cublasGemmEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp, vp, i32, i32, i32, i32]
    i64 = ctypes.c_longlong
    lib.cublasGemmStridedBatchedEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32, i32, i64,
                                               vp, vp, i32, i32, i64, i32, i32, i32]
    for fn in (lib.cublasCreate_v2, lib.cublasDestroy_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2,
               lib.cublasGemmEx, lib.cublasGemmStridedBatchedEx):
        fn.restype = i32


class _Handle:
    lib: ctypes.CDLL | None = None
    _exiting = staticmethod(sys.is_finalizing)   # held here: at exit the module's globals may already be None

    def __init__(self) -> None:
        if _Handle.lib is None:
            lib = load_cublas()
            _bind(lib)
            _Handle.lib = lib
        self.lib = _Handle.lib
        ptr = ctypes.c_void_p()
        status = self.lib.cublasCreate_v2(ctypes.byref(ptr))
        if status:
            raise RuntimeError(f"cublasCreate failed with status {status}: is the GPU usable? {INSTALL_HINT}")
        self.ptr = ptr.value
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)   # lt.py's calls in this lane use it too
        _check(self.lib.cublasSetWorkspace_v2(self.ptr, self.workspace.data.ptr, WORKSPACE_BYTES), "SetWorkspace")
        self.stream = -1

    def __del__(self) -> None:   # a released lane's (lanes.release); its workspace goes back with the array
        if getattr(self, "ptr", None) and not self._exiting():   # (at exit the driver may be gone first)
            self.lib.cublasDestroy_v2(self.ptr)

    def bind(self, stream: int) -> int:
        if stream != self.stream:
            _check(self.lib.cublasSetStream_v2(self.ptr, stream), "SetStream")
            self.stream = stream
        return self.ptr


def _check(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"cublas{what} failed with status {status}")


_handles: dict[tuple[int, str], _Handle] = lanes.per_lane({})   # (device, lane) -> its handle


# --- the small-M GEMV path (gemv.cu) ---------------------------------------------------------
GEMV_MAX_M = 8
GEMV_FILL = 1.0              # split K until the CTAs fill this fraction of the resident CTA slots (one wave)
GEMV_MIN_SPLIT_K = 1024      # ... but never below this many k per split (256 per warp)
_resident: dict[tuple[int, str], int] = {}
gemv_split_choice: dict[tuple[int, int, int], int] = {}   # (device, N, K) -> split-K factor timed at start-up
                                                           # (gemv_tune.py); other shapes take gemv_splits' rule


def gemv_resident(name: str) -> int:
    """CTAs of GEMV kernel `name` that fit on the whole GPU at once (occupancy x SMs)."""
    key = (cp.cuda.Device().id, name)
    if key not in _resident:
        _resident[key] = blocks_per_sm("gemv", name, 128) * sm_count()
    return _resident[key]


GEMV_MAX_SPLITS = 8          # a tile's splits form one thread-block cluster: at most the portable cluster size


def gemv_splits(n: int, k: int, resident: int) -> int:
    """Split-K factor for an N x K weight, static per shape (CUDA graphs): the most splits whose CTAs
    still run in one wave (N alone filling the GPU gets 1), each split at least GEMV_MIN_SPLIT_K deep.
    The rule where start-up timing (gemv_tune.py) chose nothing for the shape."""
    tiles = -(-n // 16)
    return max(1, min(int(resident * GEMV_FILL) // tiles, k // GEMV_MIN_SPLIT_K, GEMV_MAX_SPLITS))


def _gemv_usable(x2: cp.ndarray, w: cp.ndarray, m: int, k: int) -> bool:
    return (x2.dtype == BF16 and 1 <= m <= GEMV_MAX_M and k % 8 == 0 and k > 0
            and (m == 1 or (x2.strides[0] >= 0 and x2.strides[0] % 16 == 0)) and w.strides[0] % 16 == 0
            and x2.data.ptr % 16 == 0 and w.data.ptr % 16 == 0)


def launch_gemv(kernel: str, x2: cp.ndarray, w: cp.ndarray, epilogue: tuple) -> None:
    """gemv.cu's `kernel` over x2[M, K] and w[N, K] (caller checked _gemv_usable): one CTA per
    16 rows of w, the epilogue's own arguments last. Split-K as the plain GEMV would split this weight
    (its occupancy), so a fused variant sums in the same order: the same bits before its epilogue."""
    m = x2.shape[0]
    n, k = w.shape
    tuned = gemv_split_choice.get((cp.cuda.Device().id, n, k)) if gemv_split_choice else None
    splits = tuned or gemv_splits(n, k, gemv_resident("gemv_bf16"))
    if not clusters_supported():
        splits = 1
    ldx = x2.strides[0] // 2 if m > 1 else 0
    launch("gemv", kernel, (-(-n // 16), splits), 128,
           (x2, np.int64(ldx), w, np.int64(w.strides[0] // 2), np.int32(m), np.int32(k // 8), *epilogue),
           cluster=(1, splits, 1) if splits > 1 else None)


def gemv(x2: cp.ndarray, w: cp.ndarray, out2: cp.ndarray) -> None:
    """out2[M, N] = x2[M, K] @ w[N, K].T through gemv.cu (bf16, M <= 8; caller checked _gemv_usable)."""
    launch_gemv("gemv_bf16", x2, w, (out2, np.int64(out2.strides[0] // 2), np.int32(w.shape[0])))


def _record(x2: cp.ndarray, w: cp.ndarray) -> None:
    """While the loader's activation profile records (lt.recording), note a packed bf16 weight's (N, K) for the
    start-up GEMM tuning."""
    if lt.recorded is not None and x2.dtype == BF16 and w.strides[0] == 2 * w.shape[1]:
        lt.recorded.add(w.shape)


def gemv_silu_mul(x: cp.ndarray, w: cp.ndarray) -> cp.ndarray | None:
    """silu_mul(linear(x, w)) bit for bit for w = [gate; up] ([2I, K], gate rows first, I % 8 == 0) through
    one GEMV whose tile t takes gate rows 8t..8t+7 and the matching up rows (gemv.cu's SiluMul epilogue),
    so each lane holds both factors; None where the GEMV path does not apply (ops.py runs the two ops).
    Records w's shape as linear does, so gate_up is tuned even where the activation profile only reaches the GEMV."""
    x2, w = operands(x, w)
    m, k = x2.shape
    _record(x2, w)
    if w.shape[0] == 0 or w.shape[0] % 16 or not _gemv_usable(x2, w, m, k):
        return None
    inter = w.shape[0] // 2
    out = cp.empty((*x.shape[:-1], inter), dtype=x.dtype)
    launch_gemv("gemv_silu_bf16", x2, w, (out, np.int64(inter), np.int32(inter)))
    return out


def operands(x: cp.ndarray, w: cp.ndarray) -> tuple[cp.ndarray, cp.ndarray]:
    """linear's checks, then x as [M, K] rows and w, both with a unit last stride (copied only if needed)."""
    k = w.shape[1]
    if x.dtype != w.dtype or x.dtype not in _DATA_TYPE:
        raise TypeError(f"linear: x {x.dtype} and w {w.dtype} must both be bfloat16 or float32")
    if x.shape[-1] != k:
        raise ValueError(f"linear: x has {x.shape[-1]} features, w expects {k}")
    it = x.itemsize
    if w.strides[1] != it:
        w = cp.ascontiguousarray(w)
    x2 = x if x.ndim == 2 and x.strides[1] == it else cp.ascontiguousarray(x).reshape(-1, k)
    return x2, w


def linear(x: cp.ndarray, w: cp.ndarray) -> cp.ndarray:
    """x [..., in] @ w[out, in].T -> [..., out]; bf16 or f32 in and out, fp32 accumulation.

    bf16 with at most GEMV_MAX_M rows, K % 8 == 0 and 16-byte aligned rows runs the GEMV kernel
    (gemv.cu); bf16 of a shape tuned at start-up runs cuBLASLt (lt.py); everything else cublasGemmEx."""
    x2, w = operands(x, w)
    (m, k), n_out, it = x2.shape, w.shape[0], x.itemsize
    out = cp.empty((*x.shape[:-1], n_out), dtype=x.dtype)
    if m == 0 or n_out == 0:
        return out
    _record(x2, w)
    if _gemv_usable(x2, w, m, k):
        gemv(x2, w, out.reshape(m, n_out))
        return out
    dev = cp.cuda.Device().id
    if x.dtype == BF16 and lt.run(dev, x2, w, out.reshape(m, n_out)):
        return out
    handle, ptr = _bound_handle()
    _gemm_ex(handle, ptr, m, n_out, k, x2.data.ptr, x2.strides[0] // it, w.data.ptr, w.strides[0] // it,
             out.data.ptr, n_out, _DATA_TYPE[x.dtype], _DATA_TYPE[x.dtype])
    return out


def _handle() -> Any:
    """This device's cuBLAS handle in the current lane."""
    key = (cp.cuda.Device().id, lanes.current())
    return _handles.get(key) or _handles.setdefault(key, _Handle())


def _bound_handle() -> tuple[Any, int]:
    """This device's cuBLAS handle in the current lane and its pointer, bound to the current stream."""
    handle = _handle()
    return handle, handle.bind(cp.cuda.get_current_stream().ptr)


def workspace() -> cp.ndarray:
    """The current lane's workspace (WORKSPACE_BYTES) on this device."""
    return _handle().workspace


def _gemm_ex(handle: Any, ptr: int, m: int, n: int, k: int, x: int, ldx: int, w: int, ldw: int, out: int, ldo: int,
             in_type: int, out_type: int) -> None:
    """Row-major out[m, n] = x[m, k] @ w[n, k].T at these addresses and row strides (elements), fp32 accumulation."""
    _check(handle.lib.cublasGemmEx(ptr, _OP_T, _OP_N, n, m, k, ctypes.addressof(_ONE), w, in_type, ldw, x, in_type,
                                   ldx, ctypes.addressof(_ZERO), out, out_type, ldo, _COMPUTE_32F, _GEMM_DEFAULT),
           "GemmEx")


def grouped_gemm(x2: cp.ndarray, w: cp.ndarray, out2: cp.ndarray, groups: list[tuple[int, int, int]]) -> None:
    """out2[s:e] = x2[s:e] @ w[g].T for each group (g, s, e): x2 [rows, K] and out2 [rows, N] with unit last
    strides, w [G, N, K] packed, x2 and w of one dtype, out2 bf16 or float32. One cublasGemmEx a group, on
    addresses (no array views made in the loop); the groups are host values (moe_blas.py reads them back)."""
    if not groups:
        return
    (rows, k), n = x2.shape, w.shape[-2]
    if w.ndim != 3 or w.shape[2] != k or out2.shape != (rows, n) or x2.dtype != w.dtype \
            or not w.flags.c_contiguous or x2.strides[1] != x2.itemsize or out2.strides[1] != out2.itemsize:
        raise ValueError(f"grouped_gemm: x {x2.dtype} {x2.shape}, w {w.dtype} {w.shape}, out {out2.shape}: want "
                         "[rows, K] @ [G, N, K] -> [rows, N], unit last strides, packed weights")
    handle, ptr = _bound_handle()
    ix, iw, io = x2.itemsize, w.itemsize, out2.itemsize
    ldx, ldo = x2.strides[0] // ix, out2.strides[0] // io
    in_type, out_type = _DATA_TYPE[x2.dtype], _DATA_TYPE[out2.dtype]
    xp, wp, op, w_stride = x2.data.ptr, w.data.ptr, out2.data.ptr, n * k * iw
    for g, start, end in groups:
        if end > start:
            _gemm_ex(handle, ptr, end - start, n, k, xp + start * ldx * ix, ldx, wp + g * w_stride, k,
                     op + start * ldo * io, ldo, in_type, out_type)


def _per_head_gemv_usable(x: cp.ndarray, w: cp.ndarray) -> bool:
    """The per-head GEMV's conditions: the GEMV's for head 0 (x [T, in], w [out, in]), and every head's start on 16
    bytes."""
    return _gemv_usable(x[:, 0], w[0], x.shape[0], x.shape[2]) and x.strides[1] % 16 == 0 and w.strides[0] % 16 == 0


def per_head_linear(x: cp.ndarray, w: cp.ndarray) -> cp.ndarray:
    """A linear map of its own per head: x [T, H, in] (any token and head strides, unit last stride), w [H, out, in]
    (any head and row strides, unit last stride: W_UV is a view of kv_b_proj) -> [T, H, out]. bf16 with at most
    GEMV_MAX_M tokens and 16-byte aligned rows and heads runs gemv.cu's per-head GEMV (a decode step's W_UK and W_UV,
    on PDL with the kernels around them); anything else one strided-batched cublasGemmEx (head h: y_h^T =
    op_T(w_h) @ op_N(x_h^T), column-major)."""
    T, H, k = x.shape
    n_out = w.shape[1]
    if w.shape != (H, n_out, k) or x.dtype != w.dtype or x.dtype not in _DATA_TYPE:
        raise ValueError(f"per_head_linear: x {x.dtype} {x.shape} and w {w.dtype} {w.shape} (want [H, out, in] of "
                         "x's heads and features, both bfloat16 or float32)")
    it = x.itemsize
    if x.strides[2] != it or x.strides[0] % it or x.strides[1] % it:
        x = cp.ascontiguousarray(x)
    if w.strides[2] != it or w.strides[1] % it or w.strides[0] % it or w.strides[1] < k * it:
        w = cp.ascontiguousarray(w)
    out = cp.empty((T, H, n_out), dtype=x.dtype)
    if T == 0 or H == 0 or n_out == 0:
        return out
    if _per_head_gemv_usable(x, w):
        launch("gemv", "gemv_heads_bf16", (-(-n_out // 16), 1, H), 128,
               (x, np.int64(x.strides[0] // it), np.int64(x.strides[1] // it), w, np.int64(w.strides[1] // it),
                np.int64(w.strides[0] // it), np.int32(T), np.int32(k // 8), out, np.int64(H * n_out), np.int64(n_out),
                np.int32(n_out)))
        return out
    handle, ptr = _bound_handle()
    dt = _DATA_TYPE[x.dtype]
    _check(handle.lib.cublasGemmStridedBatchedEx(
        ptr, _OP_T, _OP_N, n_out, T, k, ctypes.addressof(_ONE),
        w.data.ptr, dt, w.strides[1] // it, w.strides[0] // it, x.data.ptr, dt, x.strides[0] // it, x.strides[1] // it,
        ctypes.addressof(_ZERO), out.data.ptr, dt, H * n_out, n_out, H, _COMPUTE_32F, _GEMM_DEFAULT),
        "GemmStridedBatchedEx")
    return out
