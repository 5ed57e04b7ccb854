"""CUDA kernels of the glm52 DSA ops: dsa.cu beside this file, compiled by core's NVRTC layer, with CuPy
launchers in ops.py. Importing this package touches neither cupy nor the GPU: the ops register as lazy strings."""
from __future__ import annotations

from ..ops import OPS

DTYPES = ("bfloat16", "float32")


def register(register_kernel) -> None:
    """Registers every glm52_* op for backend "cuda" (called from the plugin's register_kernels)."""
    for op in OPS:
        register_kernel(op, "cuda", f"{__name__}.ops:{op}", dtypes=DTYPES)
