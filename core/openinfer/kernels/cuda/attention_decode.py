"""Decode attention on CUDA (one query token per sequence): which kernel, each sequence's split, the grid.

bf16 runs on the tensor-core kernel (attention_decode.cu), float32 (and bf16 that is not 16-byte
aligned) on the fp32 CUDA-core kernel of attention.cu. Both give a block one KV head and the query heads
of its group, so K/V is read once per step. A sequence's keys are cut into splits by its own key count
alone (`decode_split`): how many, which keys each, and the order their partials are merged (split order,
whichever block finishes last: decode_merge.cuh) never depend on the batch, the other sequences or
`max_context_len`, so eager steps, CUDA graph replays and every batch round its attention the same. The
grid (`decode_grid`) only decides how many blocks take a sequence's splits in turn (block g takes splits
g, g + groups, ...): it changes the speed, never the bits. Splits store partials, and the last block of a
(sequence, head chunk) to finish merges them, counted on arrival_counters("decode_attention"): one
launch per layer (more only when the batch has more (sequence, head chunk) pairs than counters). The
kernel reads only the batch's device fields and the split rule's constants, so a CUDA graph captured at
the model's length serves shorter contexts: blocks past a sequence's splits leave at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import cupy as cp
import numpy as np

from .module import COUNTER_SLOTS, NULL, arrival_counters, blocks_per_sm, launch, sm_count

NWARPS, BN, GMAX = 4, 32, 8                  # must match attention.cu (its blocks' warps, key tile, group rows)
PASS = NWARPS * BN                           # its pass (a key tile of every warp): splits are whole passes
DEC_WARPS, DEC_BN, DEC_ROWS = 4, 16, 16      # must match attention_decode.cu
DEC_STAGES = {64: 3, 128: 3, 256: 2}         # cp.async ring depth per warp (DecTile::STAGES)
DEC_STAGES_KV8 = {64: 2, 128: 2, 256: 3}     # the same over fp8 caches (rows of half the bytes)
DEC_BN_KV8 = {64: 32, 128: 32, 256: 16}      # keys a tile over fp8 caches (DecTile::BN)
DEC_PASS = DEC_WARPS * DEC_BN                # its pass
# The split rule (decode_split; the kernels take these as arguments): up to DECODE_NEAR splits of DECODE_SPLIT_KEYS
# keys (in whole passes of the kernel), then DECODE_NEAR splits growing to DECODE_NEAR times that, then splits of
# that length up to DECODE_CAP of them, then longer ones. Batch 1 wants many splits (Qwen3-4B: 8 KV heads x 16
# splits of a 1k context on the tensor-core kernel), large batches few (each split stores a partial that is merged);
# a rule of the key count alone cannot serve both best. Chosen by a sweep of the kernel at Qwen3-4B's shape (H100,
# cold L2, batch 1-256 x 1k-16k keys; docs/benchmarks/qwen3-4b.md): against 16 / 32, these cost batch 1 at 1k keys
# 0.9 us (13.6 against 12.7) and save 30 % from batch 32 at 1k keys (67 against 85 us; 401 against 575 at 256).
# DECODE_NEAR and DECODE_CAP stay within merge_max_splits.
DECODE_SPLIT_KEYS = 64
DECODE_NEAR = 4
DECODE_CAP = 16


@dataclass(frozen=True)
class DecodeKernel:
    source: str      # the .cu file
    name: str
    rows: int        # query heads of a group one block takes (more: the group is cut into chunks)
    pass_len: int    # splits are whole multiples of this many keys
    smem: int        # dynamic shared memory, bytes
    threads: int     # per block
    per_sm: int      # blocks per SM one wave of the grid fills (0: what one SM holds at once)


def mma_decode_smem(d: int, kv8: bool = False) -> int:
    """The warps' K/V rings (bf16 rows padded by 8; fp8 rows as stored) and the fp32 merge area: laid over the
    rings (bf16), or past them (fp8: DecTile::MERGE_AT)."""
    rings = DEC_WARPS * (DEC_STAGES_KV8[d] * 2 * DEC_BN_KV8[d] * d if kv8 else DEC_STAGES[d] * 2 * DEC_BN * (d + 8) * 2)
    merge = DEC_WARPS * DEC_ROWS * (d + 2) * 4
    return rings + merge if kv8 else max(rings, merge)


def decode_kernel(dtype: str, d: int, itemsize: int, mma: bool, kv8: bool = False) -> DecodeKernel:
    """The tensor-core kernel (groups until one wave of resident blocks is full; `kv8`: its fp8-cache form), or
    the fp32 one, whose grid keeps its original tuning (two blocks an SM)."""
    if mma:
        return DecodeKernel("attention_decode", f"paged_decode_mma_bf16_{'kv8_' if kv8 else ''}d{d}", DEC_ROWS,
                            DEC_WARPS * DEC_BN_KV8[d] if kv8 else DEC_PASS, mma_decode_smem(d, kv8), 32 * DEC_WARPS, 0)
    words = d * itemsize // 4
    return DecodeKernel("attention", f"paged_decode_{dtype}_d{d}", GMAX, PASS,
                        (GMAX * d + NWARPS * BN * (words + 1)) * 4, 32 * NWARPS, 2)


def split_keys(kernel: DecodeKernel) -> int:
    """The keys of one of `kernel`'s short splits: DECODE_SPLIT_KEYS in whole passes."""
    return -(-max(DECODE_SPLIT_KEYS, kernel.pass_len) // kernel.pass_len) * kernel.pass_len


def decode_split(keys: int, kernel: DecodeKernel) -> tuple[int, int, int]:
    """(splits, keys a split, splits holding keys) of a decode sequence of `keys` keys on `kernel` (the kernels'
    decode_split_len, decode_merge.cuh): n = max(1, min(DECODE_NEAR, ceil(keys / u)), min(DECODE_CAP,
    ceil(keys / (DECODE_NEAR u)))) splits for u = split_keys(kernel), the keys shared evenly in whole passes.
    Only the key count decides: on the tensor-core kernel a 1k context takes 16 splits of 64 keys, 4k 16 of 256,
    16k 16 of 1024, 32k 32 of 1024, 64k 32 of 2048."""
    unit = split_keys(kernel)
    n = max(1, min(DECODE_NEAR, -(-keys // unit)), min(DECODE_CAP, -(-keys // (unit * DECODE_NEAR))))
    length = max(kernel.pass_len, -(-(-(-keys // n)) // kernel.pass_len) * kernel.pass_len)
    return n, length, -(-keys // length)


def decode_grid(num_seqs: int, kv_blocks: int, max_context_len: int, kernel: DecodeKernel) -> tuple[int, int]:
    """(groups, slots): each (sequence, head chunk) runs on `groups` blocks, which take its decode_split splits
    in turn (so `groups` changes the speed, never the bits); `slots`: partials a row, the splits of
    `max_context_len` keys (the most of any sequence of the batch: the rule is monotonic in the keys; 1: none
    stored). As many groups as one wave of resident blocks holds, none past `slots`. Rounding up instead would
    start a second, part-empty wave: 32 sequences x 8 KV heads at 4 blocks an SM took 3 groups (768 blocks for
    528 places, two waves of a third of the work each) where 2 run in one wave of half the work."""
    per_sm = kernel.per_sm or blocks_per_sm(kernel.source, kernel.name, kernel.threads, kernel.smem)
    slots = decode_split(max_context_len, kernel)[0]
    return max(1, min(slots, per_sm * sm_count() // max(1, num_seqs * kv_blocks))), slots


def merge_max_splits(kernel: DecodeKernel) -> int:
    """The merging block keeps m and l of every (head, part) in its dynamic shared memory."""
    return kernel.smem // (2 * 4 * kernel.rows)


def paged_decode(common: tuple, out: cp.ndarray, num_seqs: int, max_context_len: int, nh: int, nkv: int,
                 qscale: np.float32, kernel: DecodeKernel) -> None:
    """Launch `kernel` on paged_attention's leading arguments (`common`: q .. context_lens, out); split
    contexts are merged into `out` by the kernel's last block of each (sequence, head chunk)."""
    d = out.shape[-1]
    kv_blocks = nkv * math.ceil(nh // nkv / kernel.rows)
    groups, slots = decode_grid(num_seqs, kv_blocks, max_context_len, kernel)
    if slots > merge_max_splits(kernel):
        raise ValueError(f"paged_attention: {slots} decode splits exceed the {merge_max_splits(kernel)} that "
                         f"{kernel.name}'s merge holds; lower DECODE_NEAR / DECODE_CAP")
    # asked on every decode, split or not, so that an eager run of any batch sets them up before a capture
    counters = arrival_counters("decode_attention")
    if counters is None and slots > 1:
        raise RuntimeError("paged_attention: a decode step captured before any ran eagerly has no arrival "
                           "counters; run one decode step eagerly before capturing (cuda_graphs.py does)")
    head, (tables, table_stride, qstart, ctx) = common[:7], common[7:11]
    # each (sequence, head chunk) counts on its own counter: sequences in launches that fit them all
    step = num_seqs if slots == 1 else max(1, COUNTER_SLOTS // kv_blocks)
    for b0 in range(0, num_seqs, step):
        n = min(step, num_seqs - b0)
        parts = (NULL, NULL, NULL, NULL)
        if slots > 1:
            part_ml = cp.empty((2, n, nh, slots), dtype=cp.float32)
            parts = (cp.empty((n, nh, slots, d), dtype=cp.float32), part_ml[0], part_ml[1], counters)
        launch(kernel.source, kernel.name, (groups, kv_blocks, n), kernel.threads,
               (*head, tables[b0:], table_stride, qstart[b0:], ctx[b0:], out, *parts, np.int32(nh), np.int32(nkv),
                qscale, np.int32(split_keys(kernel)), np.int32(DECODE_NEAR), np.int32(DECODE_CAP), np.int32(slots)),
               kernel.smem)
