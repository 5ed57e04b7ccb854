"""Decode attention on CUDA (one query token per sequence): which kernel and its split-KV grid.

bf16 runs on the tensor-core kernel (attention_decode.cu), float32 (and bf16 that is not 16-byte
aligned) on the fp32 CUDA-core kernel of attention.cu. Both give a block one split of one sequence's
context, one KV head and the query heads of its group, so K/V is read once per step; both store
per-split partials, and the last block of a (sequence, head chunk) to finish merges them
(decode_merge.cuh), counted on arrival_counters("decode_attention"): one launch per layer. The grid
depends only on the batch size, the heads and `max_context_len`: each sequence divides its own length
over the splits (at least `split_keys` keys each), so a CUDA graph captured with the longest context
stays right for shorter ones: a sequence's splits past its own context leave at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import cupy as cp
import numpy as np

from .module import COUNTER_SLOTS, NULL, arrival_counters, blocks_per_sm, launch, sm_count

NWARPS, BN, GMAX = 4, 32, 8                  # must match attention.cu (its blocks' warps, key tile, group rows)
MIN_SPLIT = NWARPS * BN                      # its split: whole passes of the block's warps
DEC_WARPS, DEC_BN, DEC_ROWS = 4, 16, 16      # must match attention_decode.cu
DEC_STAGES = {64: 3, 128: 3, 256: 2}         # cp.async ring depth per warp (DecTile::STAGES)
DEC_PASS = DEC_WARPS * DEC_BN
# fewest keys a split takes (rounded up to the kernel's pass): fewer, longer splits for short contexts, so
# fewer partials to store and merge; the grid's split count (set by the longest context) is unchanged
DECODE_SPLIT_KEYS = 64


@dataclass(frozen=True)
class DecodeKernel:
    source: str      # the .cu file
    name: str
    rows: int        # query heads of a group one block takes (more: the group is cut into chunks)
    pass_len: int    # splits are whole multiples of this many keys
    smem: int        # dynamic shared memory, bytes
    threads: int     # per block
    per_sm: int      # blocks per SM the grid should fill before splitting (0: what one SM holds at once)


def mma_decode_smem(d: int) -> int:
    """The warps' K/V rings (rows padded by 8 bf16), or the fp32 merge area laid over them if larger."""
    rings = DEC_WARPS * DEC_STAGES[d] * 2 * DEC_BN * (d + 8) * 2
    merge = DEC_WARPS * DEC_ROWS * (d + 2) * 4
    return max(rings, merge)


def decode_kernel(dtype: str, d: int, itemsize: int, mma: bool) -> DecodeKernel:
    """The tensor-core kernel (split until one wave of resident blocks is full), or the fp32 one,
    whose split count keeps its original tuning (two blocks an SM)."""
    if mma:
        return DecodeKernel("attention_decode", f"paged_decode_mma_bf16_d{d}", DEC_ROWS, DEC_PASS,
                            mma_decode_smem(d), 32 * DEC_WARPS, 0)
    words = d * itemsize // 4
    return DecodeKernel("attention", f"paged_decode_{dtype}_d{d}", GMAX, MIN_SPLIT,
                        (GMAX * d + NWARPS * BN * (words + 1)) * 4, 32 * NWARPS, 2)


def decode_splits(num_seqs: int, kv_blocks: int, max_context_len: int, min_keys: int = MIN_SPLIT,
                  per_sm: int = 2) -> int:
    """Splits of each context: the most whose blocks still run in one wave of `per_sm` blocks an SM
    (none where batch x KV-head blocks alone fill it), never a split under `min_keys` keys. Rounding
    up instead would start a second, part-empty wave: 32 sequences x 8 KV heads at 4 blocks an SM
    took 3 splits (768 blocks for 528 places, two waves of a third of the work each) where 2 splits
    run in one wave of half the work. Splits past a sequence's own context exit at once, but each
    costs a block launch."""
    want = per_sm * sm_count() // max(1, num_seqs * kv_blocks)
    return max(1, min(want, math.ceil(max_context_len / min_keys)))


def split_keys(kernel: DecodeKernel) -> int:
    """The fewest keys one split of `kernel` takes: DECODE_SPLIT_KEYS in whole passes."""
    return -(-max(DECODE_SPLIT_KEYS, kernel.pass_len) // kernel.pass_len) * kernel.pass_len


def merge_max_splits(kernel: DecodeKernel) -> int:
    """The merging block keeps m and l of every (head, part) in its dynamic shared memory."""
    return kernel.smem // (2 * 4 * kernel.rows)


def paged_decode(common: tuple, out: cp.ndarray, num_seqs: int, max_context_len: int, nh: int, nkv: int,
                 qscale: np.float32, kernel: DecodeKernel) -> None:
    """Launch `kernel` on paged_attention's leading arguments (`common`: q .. context_lens, out); split
    contexts are merged into `out` by the kernel's last block of each (sequence, head chunk)."""
    d = out.shape[-1]
    kv_blocks = nkv * math.ceil(nh // nkv / kernel.rows)
    per_sm = kernel.per_sm or blocks_per_sm(kernel.source, kernel.name, kernel.threads, kernel.smem)
    min_split = split_keys(kernel)
    # at most as many parts as the merging block holds
    splits = min(decode_splits(num_seqs, kv_blocks, max_context_len, min_split, per_sm), merge_max_splits(kernel))
    # asked on every decode, split or not, so that an eager run of any batch (cuda_graphs.py runs only
    # the largest bucket, which may not split) sets them up before a smaller bucket is captured
    counters = arrival_counters("decode_attention")
    if counters is None or num_seqs * kv_blocks > COUNTER_SLOTS:   # one counter a (sequence, head chunk)
        splits = 1
    parts = (NULL, NULL, NULL, NULL)
    if splits > 1:
        part_o = cp.empty((num_seqs, nh, splits, d), dtype=cp.float32)
        part_ml = cp.empty((2, num_seqs, nh, splits), dtype=cp.float32)
        parts = (part_o, part_ml[0], part_ml[1], counters)
    launch(kernel.source, kernel.name, (splits, kv_blocks, num_seqs), kernel.threads,
           (*common, *parts, np.int32(nh), np.int32(nkv), qscale, np.int32(splits), np.int32(min_split)), kernel.smem)
