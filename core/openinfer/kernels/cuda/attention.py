"""paged_attention on CUDA: a decode kernel (split-KV, attention_decode.py) for one-token steps; for
everything else the tensor-core prefill kernel (attention_mma.cu, bf16; on Hopper with d128 the
warpgroup-MMA one, attention_wgmma.cu: 425 against 327 TFLOP/s at 16k on the H200) or the fp32 flash-style one (attention.cu), with the kernels'
launch constants mirrored here."""
from __future__ import annotations

import math
import os

import cupy as cp
import numpy as np

from ...batch import ForwardBatch
from .attention_decode import BN, DECODE_MMA, NWARPS, decode_kernel, paged_decode
from .module import as_index, heads3d, hopper, launch, suffix

ROWS = 8                               # must match attention.cu (paged_prefill rows per warp)
HEAD_DIMS = (64, 128, 256)
LOG2E = 1.4426950408889634
PREFILL_MMA = os.environ.get("OPENINFER_PREFILL_MMA", "1") != "0"   # bf16 prefill on the tensor cores (0: the fp32-core kernel)
MMA_WARPS = 4                          # must match attention_mma.cu
MMA_MT = {64: 2, 128: 2, 256: 1}       # 16-row m-tiles per warp of the default kernels
MMA_BN = {64: 64, 128: 64, 256: 32}    # keys per K/V tile
MMA_VARIANT = ""                       # "_m1": the one-m-tile-per-warp kernels (for A/B timings)
PREFILL_WGMMA = os.environ.get("OPENINFER_PREFILL_WGMMA", "1") != "0"   # d128 bf16 prefill by wgmma on sm_90 (0: mma)
WGMMA_THREADS = 256                    # must match attention_wgmma.cu: two warpgroups
WGMMA_BM = 128                         # rows per block, 64 a warpgroup
# keys per K/V tile and K/V stages of each variant (attention_wgmma.cu's WGMMA_KERNEL list)
WGMMA_TILES = {"": (128, 2), "_n64": (64, 2), "_nostagger": (128, 2), "_ov": (128, 3), "_n64ov": (64, 3)}
WGMMA_VARIANT = os.environ.get("OPENINFER_PREFILL_WGMMA_VARIANT", "")   # a WGMMA_TILES key (A/B timings)
if WGMMA_VARIANT not in WGMMA_TILES:
    raise ValueError(f"OPENINFER_PREFILL_WGMMA_VARIANT={WGMMA_VARIANT!r}: not one of {sorted(WGMMA_TILES)}")


def mma_rows_per_block(d: int, variant: str = "") -> int:
    return 16 * MMA_WARPS * (1 if variant == "_m1" else MMA_MT[d])


def mma_prefill_smem(d: int, variant: str = "") -> int:
    """Bytes of shared memory of the mma prefill kernel: Q and two K/V stages, rows padded by 8 bf16."""
    return (mma_rows_per_block(d, variant) + 4 * MMA_BN[d]) * (d + 8) * 2


def wgmma_prefill_smem(variant: str = "") -> int:
    """Bytes of shared memory of the wgmma prefill kernel: Q and the K/V stages of [rows][128] bf16, plus
    1024 bytes to align the base to the 128-byte swizzle's 1024-byte pattern."""
    bn, stages = WGMMA_TILES[variant]
    return (WGMMA_BM + 2 * stages * bn) * 128 * 2 + 1024


def _aligned16(q3: cp.ndarray, q_stride: int, k_cache: cp.ndarray, v_cache: cp.ndarray) -> bool:
    """The mma kernel copies Q, K and V rows in 16-byte units."""
    it = q3.itemsize
    return not ((q3.data.ptr | q_stride * it | k_cache.data.ptr | v_cache.data.ptr | k_cache.strides[0]) % 16)


def paged_attention(q: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray, batch: ForwardBatch,
                    scale: float) -> cp.ndarray:
    T, nh, d = q.shape
    nb, bs, nkv, _ = k_cache.shape
    it = q.itemsize
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
    dtype, words = suffix(q.dtype), d * it // 4
    qstart = as_index(batch.query_start, np.int32)
    common = (q3, np.int64(q_stride), k_cache, v_cache, np.int64(k_cache.strides[0] // it),
              np.int64(nkv * d), np.int32(bs), tables, np.int32(tables.strides[0] // tables.itemsize),
              qstart, as_index(batch.context_lens, np.int32), out)
    qscale = np.float32(scale * LOG2E)
    G = nh // nkv
    if batch.max_query_len == 1:
        mma = DECODE_MMA and dtype == "bf16" and _aligned16(q3, q_stride, k_cache, v_cache)
        paged_decode(common, out, B, batch.max_context_len, nh, nkv, qscale, decode_kernel(dtype, d, it, mma))
        return out
    if PREFILL_WGMMA and d == 128 and dtype == "bf16" and _aligned16(q3, q_stride, k_cache, v_cache) and hopper():
        tiles = WGMMA_VARIANT
        launch("attention_wgmma", f"paged_prefill_wgmma_bf16_d128{tiles}",
               (math.ceil(batch.max_query_len * G / WGMMA_BM), nkv, B), WGMMA_THREADS,
               (*common, np.int32(nh), np.int32(nkv), qscale), wgmma_prefill_smem(tiles))
        return out
    if PREFILL_MMA and dtype == "bf16" and _aligned16(q3, q_stride, k_cache, v_cache):
        variant = MMA_VARIANT
        launch("attention_mma", f"paged_prefill_mma_bf16_d{d}{variant}",
               (math.ceil(batch.max_query_len * G / mma_rows_per_block(d, variant)), nkv, B), MMA_WARPS * 32,
               (*common, np.int32(nh), np.int32(nkv), qscale), mma_prefill_smem(d, variant))
        return out
    rows_per_block = NWARPS * ROWS
    smem = (rows_per_block * d + BN * (words + 1) + BN * words) * 4
    launch("attention", f"paged_prefill_{dtype}_d{d}",
           (math.ceil(batch.max_query_len * G / rows_per_block), nkv, B), NWARPS * 32,
           (*common, np.int32(nh), np.int32(nkv), qscale), smem)
    return out
