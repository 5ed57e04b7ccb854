"""`linear` through cublasGemmEx, called directly via ctypes.

CuPy's own cuBLAS wrappers refuse CUDA-graph capture; direct cublasGemmEx calls capture and
replay bit-identically (reference/gpu-notes.md). Four entry points are all we need, so they are
bound with ctypes rather than through a bindings package (nvmath-python loads every CUDA math
library at import and, with torch installed, torch too). One handle per device, bound to the
current stream at each call, with a preallocated workspace so capture never allocates.
Row-major y[T, out] = x[T, in] @ w[out, in].T is, column-major, y^T = op_T(w) @ op_N(x^T).
"""
from __future__ import annotations

import ctypes
from typing import Any

import cupy as cp
import numpy as np

from .module import BF16

WORKSPACE_BYTES = 32 << 20
_CUDA_R_32F, _CUDA_R_16BF = 0, 14            # cudaDataType_t
_OP_N, _OP_T = 0, 1                           # cublasOperation_t
_COMPUTE_32F, _GEMM_DEFAULT = 68, -1          # cublasComputeType_t, cublasGemmAlgo_t
_DATA_TYPE = {BF16: _CUDA_R_16BF, np.dtype(np.float32): _CUDA_R_32F}
_ONE, _ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)   # host-pointer-mode alpha/beta
INSTALL_HINT = "install nvidia-cublas (part of openinfer[cuda13] / [cuda12]) or a CUDA toolkit"


def _load_cublas() -> ctypes.CDLL:
    errors = []
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # finds pip-installed NVIDIA wheels too
        return ctypes.CDLL(load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception as e:  # noqa: BLE001 — fall back to the loader's search path
        errors.append(str(e))
    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise RuntimeError(f"cannot load cuBLAS ({'; '.join(errors)}); {INSTALL_HINT}")


def _bind(lib: ctypes.CDLL) -> None:
    vp, i32 = ctypes.c_void_p, ctypes.c_int
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
    lib.cublasGemmEx.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp, vp, i32, i32, i32, i32]
    for fn in (lib.cublasCreate_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2, lib.cublasGemmEx):
        fn.restype = i32


class _Handle:
    lib: ctypes.CDLL | None = None

    def __init__(self) -> None:
        if _Handle.lib is None:
            lib = _load_cublas()
            _bind(lib)
            _Handle.lib = lib
        self.lib = _Handle.lib
        ptr = ctypes.c_void_p()
        status = self.lib.cublasCreate_v2(ctypes.byref(ptr))
        if status:
            raise RuntimeError(f"cublasCreate failed with status {status}: is the GPU usable? {INSTALL_HINT}")
        self.ptr = ptr.value
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)
        _check(self.lib.cublasSetWorkspace_v2(self.ptr, self.workspace.data.ptr, WORKSPACE_BYTES), "SetWorkspace")
        self.stream = -1

    def bind(self, stream: int) -> int:
        if stream != self.stream:
            _check(self.lib.cublasSetStream_v2(self.ptr, stream), "SetStream")
            self.stream = stream
        return self.ptr


def _check(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"cublas{what} failed with status {status}")


_handles: dict[int, _Handle] = {}


def linear(x: cp.ndarray, w: cp.ndarray) -> cp.ndarray:
    """x [..., in] @ w[out, in].T -> [..., out]; bf16 or f32 in and out, fp32 accumulation."""
    n_out, k = w.shape
    if x.dtype != w.dtype or x.dtype not in _DATA_TYPE:
        raise TypeError(f"linear: x {x.dtype} and w {w.dtype} must both be bfloat16 or float32")
    if x.shape[-1] != k:
        raise ValueError(f"linear: x has {x.shape[-1]} features, w expects {k}")
    it = x.itemsize
    if w.strides[1] != it:
        w = cp.ascontiguousarray(w)
    x2 = x if x.ndim == 2 and x.strides[1] == it else cp.ascontiguousarray(x).reshape(-1, k)
    m = x2.shape[0]
    out = cp.empty((*x.shape[:-1], n_out), dtype=x.dtype)
    if m == 0 or n_out == 0:
        return out
    dev = cp.cuda.Device().id
    handle: Any = _handles.get(dev) or _handles.setdefault(dev, _Handle())
    dt = _DATA_TYPE[x.dtype]
    _check(handle.lib.cublasGemmEx(
        handle.bind(cp.cuda.get_current_stream().ptr), _OP_T, _OP_N, n_out, m, k, ctypes.addressof(_ONE),
        w.data.ptr, dt, w.strides[0] // it, x2.data.ptr, dt, x2.strides[0] // it, ctypes.addressof(_ZERO),
        out.data.ptr, dt, n_out, _COMPUTE_32F, _GEMM_DEFAULT), "GemmEx")
    return out
