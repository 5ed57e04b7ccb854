"""MLA on CUDA: `mla_attention` over the paged latent cache (mla.cu, tensor cores, bf16); `mla_write_latent`,
`mla_rope` and `mla_rope_write` (the latent norm, both RoPEs and the cache write in one launch), and the expanded
form's gather and packing (`mla_gather_latent`, `mla_pack_heads`; layers/mla_expanded.py), all in mla_latent.cu.

Decode batches (every run one token) split each context over thread-block clusters so that batch 1 fills the GPU.
The split of a sequence depends only on its own key count (`decode_clusters`, with the device's fixed cluster size),
never on the batch, the other sequences or `max_context_len`, so batching and CUDA graphs never change its output;
the grid (`decode_grid`) only decides how many clusters run each sequence's clusters in turn, and the kernel reads
only the batch's device fields, so a CUDA graph captured at the longest context serves shorter ones (as
attention_decode.py). Runs of more tokens (prefill chunks, prefix hits, mixed steps) launch one CTA per (sequence,
32-row tile).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import cupy as cp
import numpy as np

from ...engine.batch import ForwardBatch
from .attention import LOG2E
from .module import (BF16, COUNTER_SLOTS, NULL, arrival_counters, as_index, blocks_per_sm, clusters_at_once,
                     clusters_supported, heads3d, launch, rows2d, sm_count)
from .ops import norm_suffix

LATENT, ROPE = 512, 64                 # must match mla_row.cuh (MLA_R, MLA_P)
ROW = LATENT + ROPE
BN, KEY_WARPS = 32, 4                  # keys of a tile, warps sharing an m tile's scores (mla.cu)
MAX_CLUSTER = 2                        # CTAs of a decode cluster (mla_merge.cuh merges up to MLA_MAX_CLUSTER = 8)
SPLIT_KEYS = 128                       # keys of a decode CTA while a sequence has at most NEAR_CLUSTERS clusters
NEAR_CLUSTERS = 4                      # then CTAs of NEAR_CLUSTERS * SPLIT_KEYS keys ...
MAX_CLUSTERS = 16                      # ... up to this many clusters (partials B x heads x 16 x 512), then longer
MAX_TILES = 65535                      # row tiles of one sequence: the grid's y
GATHER_ROWS = 8                        # rows of a mla_gather_latent block (mla_latent.cu MLA_GATHER_ROWS)
ROPE_WRITE_THREADS = 128               # threads of a mla_rope_write block (mla_latent.cu)


def smem(rows: int, chains: int = 1) -> int:
    """Mla<MT, KS>::SMEM: Q rows, two K/V stages, P, the warps' row maxima, the second chains' sums (the merge area
    lies over the stages)."""
    exchange = (chains - 1) * KEY_WARPS * (rows // 16) * 32 * 4 * 4
    return rows * (ROW + 8) * 2 + 2 * BN * (ROW + 8) * 2 + rows * (BN + 8) * 2 + KEY_WARPS * rows * 4 + exchange


@dataclass(frozen=True)
class MlaKernel:
    name: str
    rows: int      # rows (token, head) of a block
    threads: int
    chains: int = 1   # warps sharing each score tile (mla.cu's KS)

    @property
    def smem(self) -> int:
        return smem(self.rows, self.chains)


DECODE = MlaKernel("mla_attention_bf16", 16, 128)   # one m16 tile a block: splits merged in the kernel
# the same arithmetic on twice the warps (each score tile's two accumulator chains on a warp each, half of O's
# columns a warp): the same bits, so small decode batches, whose few CTAs each walk their tiles in series, take it
DECODE_W8 = MlaKernel("mla_attention_w8_bf16", 16, 256, chains=2)
W8_MAX_TILES = 8                                    # (sequence, row tile) pairs of a decode step up to which it runs
PREFILL = MlaKernel("mla_prefill_bf16", 32, 256)    # two: each K/V tile serves twice the rows


def decode_cluster_size() -> int:
    """CTAs of a decode cluster on this device: the largest size up to MAX_CLUSTER of which the GPU runs one (1:
    no clusters). Fixed per device, not per batch: the cluster merge's rounding is part of each sequence's result.
    Two, measured on the H100 (docs/benchmarks/deepseek-v2-lite.md): clusters of 8 win at batch 1 but lose under
    load (eight co-scheduled CTAs, the wider merge), up to twice the time at batch 32 x 16k keys."""
    if not clusters_supported():
        return 1
    cs = MAX_CLUSTER
    while cs > 1 and clusters_at_once("mla", DECODE.name, DECODE.threads, DECODE.smem, cs) < 1:
        cs //= 2
    return cs


def decode_clusters(keys: int, cs: int) -> tuple[int, int, int]:
    """(clusters, keys a CTA, clusters holding keys) of a decode sequence of `keys` keys in clusters of cs (mla.cu's
    split rule): up to NEAR_CLUSTERS clusters of SPLIT_KEYS-key CTAs, then CTAs of NEAR_CLUSTERS * SPLIT_KEYS keys
    up to MAX_CLUSTERS clusters, then longer CTAs; the keys shared evenly over their CTAs in whole tiles. Only the
    key count decides, so one rule serves batch 1 (which wants many CTAs) and batch 128 (which wants few): a 1k
    context takes 4 clusters of 2 (128 keys a CTA), 4k 4 of 2 (512), 16k 16 of 2 (512)."""
    short = min(NEAR_CLUSTERS, -(-keys // (cs * SPLIT_KEYS)))
    n = max(1, short, min(MAX_CLUSTERS, -(-keys // (cs * SPLIT_KEYS * NEAR_CLUSTERS))))
    split = -(-(-(-keys // (n * cs))) // BN) * BN
    return n, split, -(-keys // (cs * split))


def decode_kernel(num_seqs: int, tiles: int) -> MlaKernel:
    """The decode kernel of a step: eight warps a CTA for small batches (W8_MAX_TILES), four above; the same bits."""
    return DECODE_W8 if num_seqs * tiles <= W8_MAX_TILES else DECODE


def decode_grid(num_seqs: int, tiles: int, max_context_len: int) -> tuple[int, int, int]:
    """(cs, groups, slots): each (sequence, row tile) of a decode step runs on `groups` clusters of cs CTAs, which
    take the sequence's decode_clusters in turn (so `groups` changes the speed, never the bits); `slots`: partials
    a row (the most clusters of any sequence up to max_context_len keys; 1: none stored). Enough groups that one
    wave of the GPU is busy, no more than the longest sequence has clusters: a CUDA graph captured at the model's
    length launches no more CTAs than its batch fills the GPU with."""
    cs, k = decode_cluster_size(), decode_kernel(num_seqs, tiles)
    slots = decode_clusters(max_context_len, cs)[0]
    if cs > 1:
        at_once = clusters_at_once("mla", k.name, k.threads, k.smem, cs)
    else:
        at_once = blocks_per_sm("mla", k.name, k.threads, k.smem) * sm_count()
    return cs, max(1, min(slots, at_once // (num_seqs * tiles))), slots


def _check_cache(op: str, cache: cp.ndarray) -> None:
    if cache.ndim != 3 or cache.shape[2] != ROW or cache.strides[1:] != (ROW * 2, 2) or cache.dtype != BF16:
        raise ValueError(f"{op}: the latent cache must be a bf16 [num_blocks, block_size, {ROW}] view packed inside "
                         f"a block (got {cache.dtype} {cache.shape}, strides {cache.strides})")


def mla_write_latent(cache: cp.ndarray, c: cp.ndarray, k_pe: cp.ndarray, slot_mapping) -> None:
    """cache[slot] = c[t] || k_pe[t] for cache [num_blocks, block_size, 576]; negative slots are skipped."""
    _check_cache("mla_write_latent", cache)
    if c.shape[-1] != LATENT or k_pe.shape[-1] != ROPE or c.dtype != BF16 or k_pe.dtype != BF16:
        raise ValueError(f"mla_write_latent: c [T, {LATENT}] and k_pe [T, {ROPE}] bf16 (got {c.shape}, {k_pe.shape})")
    c2, cs = rows2d(c)
    p2, ps = rows2d(k_pe)
    T = c2.shape[0]
    if T:
        launch("mla_latent", "mla_write_latent_bf16", (T,), 192,
               (cache, np.int64(cache.strides[0] // 2), np.int32(cache.shape[1]), c2, np.int64(cs), p2, np.int64(ps),
                as_index(slot_mapping, np.int64)))


def mla_rope(q_pe: cp.ndarray, k_pe: cp.ndarray, positions, cos: cp.ndarray, sin: cp.ndarray
             ) -> tuple[cp.ndarray, cp.ndarray]:
    """DeepSeek's interleaved RoPE of q_pe [T, H, P] and the shared k_pe [T, P] (any slices of the projections);
    cos / sin [max_pos, P / 2] tables. Returns packed rotated copies."""
    T, nh, p = q_pe.shape
    half = cos.shape[1]
    if p != 2 * half or k_pe.shape != (T, p) or q_pe.dtype != BF16 or k_pe.dtype != BF16:
        raise ValueError(f"mla_rope: q_pe [T, H, {2 * half}] and k_pe [T, {2 * half}] bf16 for tables of {half} "
                         f"frequencies (got {q_pe.dtype} {q_pe.shape}, {k_pe.dtype} {k_pe.shape})")
    if q_pe.strides[2] != 2 or k_pe.strides[1] != 2:
        q_pe, k_pe = cp.ascontiguousarray(q_pe), cp.ascontiguousarray(k_pe)
    q_out, k_out = cp.empty((T, nh, p), dtype=BF16), cp.empty((T, p), dtype=BF16)
    if T:
        cos = cp.ascontiguousarray(cos, dtype=cp.float32)   # tables are built float32; converting copies
        sin = cp.ascontiguousarray(sin, dtype=cp.float32)
        launch("mla_latent", "mla_rope_bf16", (T,), 128,
               (q_pe, np.int64(q_pe.strides[0] // 2), np.int64(q_pe.strides[1] // 2), k_pe,
                np.int64(k_pe.strides[0] // 2), as_index(positions, np.int32), cos, sin, np.int32(half),
                np.int32(nh), q_out, k_out))
    return q_out, k_out


def mla_rope_write(q_pe: cp.ndarray, kv: cp.ndarray, norm_w: cp.ndarray, eps: float, positions, cos: cp.ndarray,
                   sin: cp.ndarray, cache: cp.ndarray, slot_mapping) -> cp.ndarray:
    """numpy_mla_moe.mla_rope_write in one launch: rms_norm(kv[:, :512]) * norm_w and the rotated kv[:, 512:] into
    the latent cache at slot_mapping (negative slots skipped); returns q_pe [T, H, 64] rotated, packed."""
    _check_cache("mla_rope_write", cache)
    T, nh, p = q_pe.shape
    half = cos.shape[1]
    if (p != ROPE or half * 2 != ROPE or kv.shape != (T, ROW) or norm_w.shape != (LATENT,)
            or q_pe.dtype != BF16 or kv.dtype != BF16):
        raise ValueError(f"mla_rope_write: q_pe [T, H, {ROPE}] and kv [T, {ROW}] bf16, a [{LATENT}] norm weight and "
                         f"tables of {ROPE // 2} frequencies (got {q_pe.dtype} {q_pe.shape}, {kv.dtype} {kv.shape}, "
                         f"{norm_w.shape}, {half})")
    if q_pe.strides[2] != 2:
        q_pe = cp.ascontiguousarray(q_pe)
    kv2, ks = rows2d(kv)
    q_out = cp.empty((T, nh, p), dtype=BF16)
    if T:
        launch("mla_latent", f"mla_rope_write_{norm_suffix(kv.dtype, norm_w.dtype)}", (T,), ROPE_WRITE_THREADS,
               (q_pe, np.int64(q_pe.strides[0] // 2), np.int64(q_pe.strides[1] // 2), kv2, np.int64(ks),
                cp.ascontiguousarray(norm_w), np.float32(eps), as_index(positions, np.int32),
                cp.ascontiguousarray(cos, dtype=cp.float32), cp.ascontiguousarray(sin, dtype=cp.float32),
                np.int32(half), np.int32(nh), cache, np.int64(cache.strides[0] // 2), np.int32(cache.shape[1]),
                as_index(slot_mapping, np.int64), q_out))
    return q_out


def _queries(q: cp.ndarray, width: int) -> tuple[cp.ndarray, int]:
    """q [T, H, width] with heads packed and 16-byte aligned rows (the kernel copies 16-byte words)."""
    q3, stride = heads3d(q)
    if (q3.data.ptr | stride * 2) % 16:
        q3 = cp.ascontiguousarray(q3)
        stride = q3.strides[0] // 2
    return q3, stride


def mla_attention(q_latent: cp.ndarray, q_pe: cp.ndarray, cache: cp.ndarray, batch: ForwardBatch,
                  scale: float) -> cp.ndarray:
    """Causal MQA over the latent cache: out [T, H, 512] = softmax((q_latent . c + q_pe . k_pe) * scale) . c."""
    _check_cache("mla_attention", cache)
    T, nh, r = q_latent.shape
    if r != LATENT or q_pe.shape != (T, nh, ROPE) or q_latent.dtype != BF16 or q_pe.dtype != BF16:
        raise ValueError(f"mla_attention: q_latent [T, H, {LATENT}] and q_pe [T, H, {ROPE}] bf16 "
                         f"(got {q_latent.dtype} {q_latent.shape}, {q_pe.dtype} {q_pe.shape})")
    if cache.data.ptr % 16 or cache.strides[0] % 16:
        raise ValueError("mla_attention: the latent cache must be 16-byte aligned")
    ql, ql_stride = _queries(q_latent, LATENT)
    qp, qp_stride = _queries(q_pe, ROPE)
    out = cp.empty((T, nh, LATENT), dtype=BF16)
    B = batch.num_seqs
    if T == 0 or B == 0:
        return out
    tables = as_index(batch.block_tables, np.int32)
    kernel = DECODE if batch.max_query_len == 1 else PREFILL
    tiles = math.ceil(batch.max_query_len * nh / kernel.rows)
    if kernel is DECODE:
        kernel = decode_kernel(B, tiles)
    if tiles > MAX_TILES:
        raise ValueError(f"mla_attention: a run of {batch.max_query_len} tokens x {nh} heads exceeds the grid "
                         f"({MAX_TILES * kernel.rows} rows); prefill in smaller chunks (--max-num-batched-tokens)")
    common = (ql, np.int64(ql_stride), qp, np.int64(qp_stride), cache, np.int64(cache.strides[0] // 2),
              np.int32(cache.shape[1]), tables, np.int32(tables.strides[0] // tables.itemsize))
    if kernel is PREFILL:
        launch("mla", kernel.name, (1, tiles, B), kernel.threads,
               (*common, as_index(batch.query_start, np.int32), as_index(batch.context_lens, np.int32), out, NULL,
                NULL, NULL, NULL, np.int32(nh), np.float32(scale * LOG2E), np.int32(SPLIT_KEYS), np.int32(1),
                np.int32(1), np.int32(1), np.int32(1)), kernel.smem)
        return out
    cs, groups, slots = decode_grid(B, tiles, batch.max_context_len)
    # asked on every decode so that an eager run sets the counters up before any capture
    counters = arrival_counters("decode_attention")
    if counters is None and slots > 1:
        raise RuntimeError("mla_attention: a decode step captured before any ran eagerly has no arrival counters; "
                           "run one decode step eagerly before capturing (cuda_graphs.py does)")
    qstart, ctx = as_index(batch.query_start, np.int32), as_index(batch.context_lens, np.int32)
    # each (rank, sequence, row tile) counts on its own counter: sequences in launches that fit them all
    step = B if slots == 1 else max(1, COUNTER_SLOTS // (cs * tiles))
    for b0 in range(0, B, step):
        n = min(step, B - b0)
        parts = (NULL, NULL, NULL, NULL)
        if slots > 1:
            part_ml = cp.empty((2, cs, n, nh, slots), dtype=cp.float32)
            parts = (cp.empty((n, nh, slots, LATENT), dtype=cp.float32), part_ml[0], part_ml[1], counters)
        launch("mla", kernel.name, (cs * groups, tiles, n), kernel.threads,
               (*common[:7], tables[b0:], common[8], qstart[b0:], ctx[b0:], out, *parts, np.int32(nh),
                np.float32(scale * LOG2E), np.int32(SPLIT_KEYS), np.int32(NEAR_CLUSTERS), np.int32(MAX_CLUSTERS),
                np.int32(slots), np.int32(cs)), kernel.smem, cluster=(cs, 1, 1) if cs > 1 else None)
    return out


def mla_gather_latent(cache: cp.ndarray, batch: ForwardBatch) -> tuple[cp.ndarray, cp.ndarray]:
    """Every sequence's context latents side by side, [sum of context_lens, 576], and the block table addressing
    them as blocks of one row, [B, max context] int32 (numpy_mla_moe.mla_gather_latent)."""
    _check_cache("mla_gather_latent", cache)
    if cache.data.ptr % 16 or cache.strides[0] % 16:
        raise ValueError("mla_gather_latent: the latent cache must be 16-byte aligned")
    lens = np.asarray(batch.context_lens_host, np.int64)
    starts = np.concatenate(([0], np.cumsum(lens)))
    width = int(lens.max(initial=0))
    out = cp.empty((int(starts[-1]), ROW), dtype=BF16)
    out_tables = cp.empty((len(lens), width), dtype=cp.int32)
    if width:
        tables = as_index(batch.block_tables, np.int32)
        launch("mla_latent", "mla_gather_latent_bf16", (-(-width // GATHER_ROWS), len(lens)), GATHER_ROWS * ROW // 8,
               (cache, np.int64(cache.strides[0] // 2), np.int32(cache.shape[1]), tables,
                np.int32(tables.strides[0] // tables.itemsize), as_index(batch.context_lens, np.int32),
                as_index(starts, np.int64), out, out_tables, np.int32(width)))
    return out, out_tables


def mla_pack_heads(parts: list[tuple[cp.ndarray, cp.ndarray | None]], width: int) -> cp.ndarray:
    """Heads side by side, each row [a | b | zeros] of `width` (numpy_mla_moe.mla_pack_heads): a [N, h, da] and b
    [N, h, db], [N, db] (a row every head shares) or None, any row and head strides with a unit last stride. A part
    whose counts, strides and pointers are all whole 16-byte words moves words (the `_v_` kernel)."""
    n = parts[0][0].shape[0]
    out = cp.empty((n, sum(a.shape[1] for a, _ in parts), width), dtype=BF16)
    h0 = 0
    for a, b in parts:
        heads, da = a.shape[1:]
        db = 0 if b is None else b.shape[-1]
        if a.shape[0] != n or a.dtype != BF16 or a.strides[2] != 2 or (b is not None and (
                b.dtype != BF16 or b.strides[-1] != 2 or b.shape[:-1] not in ((n, heads), (n,)))):
            raise ValueError(f"mla_pack_heads: a [N, h, da] and b [N, h, db] or [N, db] bf16 with a unit last stride "
                             f"(got {a.dtype} {a.shape}, {None if b is None else (b.dtype, b.shape)})")
        if da + db > width:
            raise ValueError(f"mla_pack_heads: {da + db} columns do not fit width {width}")
        dst = out[:, h0: h0 + heads]
        counts = [a.strides[0] // 2, a.strides[1] // 2, da, db, out.strides[0] // 2, width]
        pointers = [a.data.ptr, dst.data.ptr]
        if b is not None:
            counts += [b.strides[0] // 2, b.strides[1] // 2 if b.ndim == 3 else 0]
            pointers.append(b.data.ptr)
        v = 8 if all(c % 8 == 0 for c in counts) and all(p % 16 == 0 for p in pointers) else 1
        b_args = (NULL, np.int64(0), np.int64(0)) if b is None else \
            (b, np.int64(b.strides[0] // 2 // v), np.int64((b.strides[1] // 2 if b.ndim == 3 else 0) // v))
        if n and heads:
            launch("mla_latent", f"mla_pack_heads_{'v_' if v > 1 else ''}bf16", (n,), 256,
                   (a, np.int64(a.strides[0] // 2 // v), np.int64(a.strides[1] // 2 // v), np.int32(da // v), *b_args,
                    np.int32(db // v), dst, np.int64(out.strides[0] // 2 // v), np.int32(heads), np.int32(width // v)))
        h0 += heads
    return out
