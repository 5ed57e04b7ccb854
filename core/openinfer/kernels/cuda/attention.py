"""paged_attention on CUDA: a decode kernel (split-KV, attention_decode.py) for one-token steps, a prefill
kernel for everything else, with the kernels' launch constants mirrored here. Three registry implementations:

- "wgmma" (bf16, sm_90 only; the default there): the tensor-core decode kernel, and d128 prefill on warpgroup MMA
  (attention_wgmma.cu: 425 against mma.sync's 327 TFLOP/s at 16k on the H200); other head dims as "mma".
- "mma" (bf16; the default elsewhere): the tensor-core decode kernel and mma.sync prefill (attention_mma.cu).
- "cuda_cores" (bf16 and float32; float32's only one): the fp32 flash-style kernels of attention.cu.

A call the tensor-core kernels cannot take (rows not 16-byte aligned) runs the CUDA-core kernels. fp8 caches
(uint8 e4m3 bytes, --kv-cache-dtype fp8) run on the tensor-core kernels' fp8 forms in every implementation, which
multiply in f16 (fp8.cuh): the decode kernel converting the bytes as it reads its fragments, prefill converting
each K/V tile to f16 in shared memory (on warpgroup MMA at d128 on sm_90, mma.sync elsewhere)."""
from __future__ import annotations

import math

import cupy as cp
import numpy as np

from ...engine.batch import ForwardBatch
from ...quant.fp8 import E4M3
from .attention_decode import BN, NWARPS, decode_kernel, paged_decode
from .module import as_index, heads3d, hopper, launch, suffix

ROWS = 8                               # must match attention.cu (paged_prefill rows per warp)
HEAD_DIMS = (64, 128, 256)
LOG2E = 1.4426950408889634
MMA_WARPS = 4                          # must match attention_mma.cu
MMA_MT = {64: 2, 128: 2, 256: 1}       # 16-row m-tiles per warp (attention_mma.cu's MMA_KERNEL list)
MMA_BN = {64: 64, 128: 64, 256: 32}    # keys per K/V tile
WGMMA_THREADS = 256                    # must match attention_wgmma.cu: two warpgroups
WGMMA_BM = 128                         # rows per block, 64 a warpgroup
WGMMA_BN, WGMMA_STAGES = 128, 2       # keys per K/V tile and K/V stages (attention_wgmma.cu)


def mma_rows_per_block(d: int) -> int:
    return 16 * MMA_WARPS * MMA_MT[d]


def mma_prefill_smem(d: int, kv8: bool = False) -> int:
    """Bytes of shared memory of the mma prefill kernel: Q and two K/V stages, rows padded by 8 bf16 (`kv8`: two
    fp8 K/V stages as stored and one converted f16 K/V tile)."""
    if kv8:
        return (mma_rows_per_block(d) + 2 * MMA_BN[d]) * (d + 8) * 2 + 4 * MMA_BN[d] * d
    return (mma_rows_per_block(d) + 4 * MMA_BN[d]) * (d + 8) * 2


def wgmma_prefill_smem(kv8: bool = False) -> int:
    """Bytes of shared memory of the wgmma prefill kernel: Q and the K/V stages of [rows][128] bf16 (`kv8`: fp8
    stages as stored and two buffers of converted f16 K/V tiles), plus 1024 bytes to align the base to the 128-byte
    swizzle's 1024-byte pattern."""
    if kv8:
        return WGMMA_BM * 128 * 2 + 2 * WGMMA_STAGES * WGMMA_BN * 128 + 2 * 2 * WGMMA_BN * 128 * 2 + 1024
    return (WGMMA_BM + 2 * WGMMA_STAGES * WGMMA_BN) * 128 * 2 + 1024


def _aligned16(q3: cp.ndarray, q_stride: int, k_cache: cp.ndarray, v_cache: cp.ndarray) -> bool:
    """The mma kernel copies Q, K and V rows in 16-byte units."""
    it = q3.itemsize
    return not ((q3.data.ptr | q_stride * it | k_cache.data.ptr | v_cache.data.ptr | k_cache.strides[0]) % 16)


def paged_attention(q: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray, batch: ForwardBatch,
                    scale: float) -> cp.ndarray:
    """The "wgmma" implementation (sm_90)."""
    return _paged_attention(q, k_cache, v_cache, batch, scale, "wgmma")


def paged_attention_mma(q: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray, batch: ForwardBatch,
                        scale: float) -> cp.ndarray:
    """The "mma" implementation."""
    return _paged_attention(q, k_cache, v_cache, batch, scale, "mma")


def paged_attention_cuda_cores(q: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray, batch: ForwardBatch,
                               scale: float) -> cp.ndarray:
    """The "cuda_cores" implementation."""
    return _paged_attention(q, k_cache, v_cache, batch, scale, "cuda_cores")


def _paged_attention(q: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray, batch: ForwardBatch, scale: float,
                     impl: str) -> cp.ndarray:
    T, nh, d = q.shape
    nb, bs, nkv, _ = k_cache.shape
    it, kv8 = k_cache.itemsize, k_cache.dtype == E4M3
    if d not in HEAD_DIMS:
        raise ValueError(f"paged_attention: head dim {d} not compiled (have {HEAD_DIMS})")
    if nh % nkv:
        raise ValueError(f"paged_attention: {nh} query heads do not group over {nkv} KV heads")
    if k_cache.strides[1:] != (nkv * d * it, d * it, it) or v_cache.strides != k_cache.strides:
        raise ValueError("paged_attention: caches must be packed inside a block; only the block stride may differ")
    q3, q_stride = heads3d(q)
    out = cp.empty(q.shape, dtype=q.dtype)
    B = batch.num_seqs
    if T == 0 or B == 0:
        return out
    tables = as_index(batch.block_tables, np.int32)
    dtype, words = suffix(q.dtype), d * q.itemsize // 4
    qstart = as_index(batch.query_start, np.int32)
    common = (q3, np.int64(q_stride), k_cache, v_cache, np.int64(k_cache.strides[0] // it),
              np.int64(nkv * d), np.int32(bs), tables, np.int32(tables.strides[0] // tables.itemsize),
              qstart, as_index(batch.context_lens, np.int32), out)
    qscale = np.float32(scale * LOG2E)
    G = nh // nkv
    tensor_cores = (impl != "cuda_cores" or kv8) and dtype == "bf16" and _aligned16(q3, q_stride, k_cache, v_cache)
    if kv8 and not tensor_cores:
        raise ValueError(f"paged_attention: an fp8 KV cache needs bf16 activations and 16-byte aligned rows "
                         f"(got {q.dtype}, head dim {d})")
    if batch.max_query_len == 1:
        paged_decode(common, out, B, batch.max_context_len, nh, nkv, qscale,
                     decode_kernel(dtype, d, q.itemsize, tensor_cores, kv8))
        return out
    form = "kv8_" if kv8 else ""
    if tensor_cores and (impl == "wgmma" or kv8) and d == 128 and hopper():
        launch("attention_wgmma", f"paged_prefill_wgmma_bf16_{form}d128",
               (math.ceil(batch.max_query_len * G / WGMMA_BM), nkv, B), WGMMA_THREADS,
               (*common, np.int32(nh), np.int32(nkv), qscale), wgmma_prefill_smem(kv8))
        return out
    if tensor_cores:
        launch("attention_mma", f"paged_prefill_mma_bf16_{form}d{d}",
               (math.ceil(batch.max_query_len * G / mma_rows_per_block(d)), nkv, B), MMA_WARPS * 32,
               (*common, np.int32(nh), np.int32(nkv), qscale), mma_prefill_smem(d, kv8))
        return out
    rows_per_block = NWARPS * ROWS
    smem = (rows_per_block * d + BN * (words + 1) + BN * words) * 4
    launch("attention", f"paged_prefill_{dtype}_d{d}",
           (math.ceil(batch.max_query_len * G / rows_per_block), nkv, B), NWARPS * 32,
           (*common, np.int32(nh), np.int32(nkv), qscale), smem)
    return out
