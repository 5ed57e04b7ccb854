"""The CUDA part of the plugin API: compiling and launching a plugin's own kernels, and cuBLAS.

Importing this module imports CuPy; a plugin imports it only from the code that runs on a GPU.

A plugin's .cu sources are compiled with the core's kernel folder on the include path; of its headers, the ones in
HEADERS are part of this API (the others are the core's own kernels' internals and may change):
- common.cuh: the bf16 storage type and its fp32 conversions, warp reductions, programmatic dependent launch waits;
- mma.cuh: cp.async copies, ldmatrix, mma.sync m16n8k16 bf16 -> fp32, ex2 and bf16x2 packing (sm_80+);
- cluster.cuh: thread-block cluster barriers and distributed shared memory loads (sm_90+);
- wgmma.cuh: Hopper warpgroup MMA descriptors, fences and shapes (sm_90a).
"""
from __future__ import annotations

from ..kernels.cuda import blas, pdl
from ..kernels.cuda.module import NULL, as_index, clusters_supported, heads3d, launch, rows2d, sm_count, suffix

HEADERS = ("common.cuh", "mma.cuh", "cluster.cuh", "wgmma.cuh")

__all__ = ["HEADERS", "NULL", "as_index", "blas", "clusters_supported", "heads3d", "launch", "pdl", "rows2d",
           "sm_count", "suffix"]
