"""The core's own kernel implementations, registered like any plugin's."""
from __future__ import annotations

from .hookspecs import hookimpl


@hookimpl
def register_kernels(register) -> None:
    from ..kernels import numpy_mla_moe, numpy_ops, numpy_quant
    numpy_ops.register(register)
    numpy_mla_moe.register(register)
    numpy_quant.register(register)
    try:  # the CUDA ops import cupy lazily, so this succeeds on machines without a GPU too
        from ..kernels.cuda import register as register_cuda
    except ImportError:
        return
    register_cuda(register)
