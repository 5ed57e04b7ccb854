"""CUDA kernels of the Qwen3.5 line's ops (Gated DeltaNet and the attention output gate): .cu
sources beside this file, compiled by core's NVRTC layer, with CuPy launchers in ops.py.

Importing this package touches neither cupy nor the GPU: the ops are registered as lazy strings.
"""
from __future__ import annotations

from ..ops import OPS

DTYPES = ("bfloat16", "float32")


def register(register_kernel) -> None:
    """Registers every qwen35_* op for backend "cuda" (called from the plugin's register_kernels)."""
    for op in OPS:
        register_kernel(op, "cuda", f"{__name__}.ops:{op}", dtypes=DTYPES)
