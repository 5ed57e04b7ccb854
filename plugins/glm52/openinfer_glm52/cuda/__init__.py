"""CUDA kernels of the glm52 DSA ops. Two implementations:
- "nvrtc": hand-written kernels in dsa.cu beside this file, compiled by core's NVRTC layer, with CuPy launchers in
  ops.py; every op, bf16 and float32.
- "tilelang": TileLang programs (plugin folder kernels_src/) built ahead of time into the sm_90a cubins of
  tilelang/, launched by tilelang_ops.py; sparse MLA attention and the indexer's scores and top-k, bf16 on sm_90
  only. "tilelang+nvrtc": the TileLang indexer scores with the hand-written top-k. `--kernel OP=NAME` picks any.
On sm_90 the TileLang ones rank first, as measured on an H100 (scripts/glm52_dsa_times.py, GLM-5.2 decode shapes):
the sparse MLA attention ~110 us against 2.8-3.6 ms hand-written; the indexer's scores + top-k 74-604 us against
109-723 us at batch 1 (8k-128k keys) and 114-310 against 496-1,814 us at batch 32, while the hand-written top-k alone
was the faster select even as one CTA a row (35-481 against 55-572 us), so TileLang scores + that select rank above
both. The hand-written select now splits a long row over a thread-block cluster of up to 8 CTAs (dsa.cu).
Importing this package touches neither cupy nor the GPU: the ops register as lazy strings."""
from __future__ import annotations

from ..ops import OPS

DTYPES = ("bfloat16", "float32")
NVRTC_PRIORITY, TILELANG_PRIORITY = 10, 20
TILELANG_OPS = ("glm52_indexer_topk", "glm52_sparse_mla_attention")


def register(register_kernel) -> None:
    """Registers every glm52_* op for backend "cuda" (called from the plugin's register_kernels)."""
    for op in OPS:
        register_kernel(op, "cuda", f"{__name__}.ops:{op}", dtypes=DTYPES, priority=NVRTC_PRIORITY, name="nvrtc")
    for op in TILELANG_OPS:
        register_kernel(op, "cuda", f"{__name__}.tilelang_ops:{op}", dtypes=("bfloat16",),
                        priority=TILELANG_PRIORITY, name="tilelang", capabilities=(90,))
    register_kernel("glm52_indexer_topk", "cuda", f"{__name__}.tilelang_ops:glm52_indexer_topk_nvrtc_select",
                    dtypes=("bfloat16",), priority=TILELANG_PRIORITY + 1, name="tilelang+nvrtc", capabilities=(90,))
