"""`linear` through cublasGemmEx, called via nvmath-python's bindings.

CuPy's own cuBLAS wrappers refuse CUDA-graph capture; direct cublasGemmEx calls capture and
replay bit-identically (reference/gpu-notes.md). One handle per device, bound to the current
stream at each call, with a preallocated workspace so capture never allocates.
Row-major y[T, out] = x[T, in] @ w[out, in].T is, column-major, y^T = op_T(w) @ op_N(x^T).
"""
from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np

from .module import BF16

WORKSPACE_BYTES = 32 << 20
_CUDA_R_32F, _CUDA_R_16BF = 0, 14   # cudaDataType_t
_DATA_TYPE = {BF16: _CUDA_R_16BF, np.dtype(np.float32): _CUDA_R_32F}
_ONE, _ZERO = np.ones(1, np.float32), np.zeros(1, np.float32)   # host-pointer-mode alpha/beta


def _cublas() -> Any:
    try:
        from nvmath.bindings import cublas
    except ImportError as e:
        raise RuntimeError("linear on CUDA calls cuBLAS through nvmath-python, which is not installed: "
                           "pip install 'openinfer[cuda13]' (or [cuda12]), or nvmath-python itself") from e
    return cublas


class _Handle:
    def __init__(self) -> None:
        self.lib = _cublas()
        try:
            self.ptr = self.lib.create()
        except Exception as e:  # the library itself is missing, or the GPU is unusable
            raise RuntimeError(f"cannot create a cuBLAS handle ({e}); install nvidia-cublas "
                               "(part of openinfer[cuda13]) or a CUDA toolkit") from e
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)
        self.lib.set_workspace(self.ptr, self.workspace.data.ptr, WORKSPACE_BYTES)
        self.stream = -1

    def bind(self, stream: int) -> int:
        if stream != self.stream:
            self.lib.set_stream(self.ptr, stream)
            self.stream = stream
        return self.ptr


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
    handle = _handles.get(dev) or _handles.setdefault(dev, _Handle())
    lib, dt = handle.lib, _DATA_TYPE[x.dtype]
    lib.gemm_ex(handle.bind(cp.cuda.get_current_stream().ptr), lib.Operation.T, lib.Operation.N,
                n_out, m, k, _ONE.ctypes.data, w.data.ptr, dt, w.strides[0] // it,
                x2.data.ptr, dt, x2.strides[0] // it, _ZERO.ctypes.data, out.data.ptr, dt, n_out,
                lib.ComputeType.COMPUTE_32F, lib.GemmAlgo.DEFAULT)
    return out
