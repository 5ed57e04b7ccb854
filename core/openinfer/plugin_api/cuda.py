"""The CUDA part of the plugin API: compiling and launching a plugin's own kernels, and cuBLAS.

Importing this module imports CuPy; a plugin imports it only from the code that runs on a GPU.
"""
from __future__ import annotations

from ..kernels.cuda import blas, pdl
from ..kernels.cuda.module import NULL, as_index, heads3d, launch, rows2d, suffix

__all__ = ["NULL", "as_index", "blas", "heads3d", "launch", "pdl", "rows2d", "suffix"]
