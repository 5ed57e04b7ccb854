"""CUDA implementations of the glm52_* ops (dsa.cu): the numpy reference signatures (../ops.py) on CuPy arrays,
bf16 or f32 activations and caches, float32 indexer weights and scores.

ForwardBatch fields read on the device: query_start, context_lens, block_tables (a token finds its sequence
by a binary search over query_start); on the host: num_seqs and max_context_len, which sizes the indexer's
score rows (a decode graph's batch carries the model's length there, so the graph's buffers fit any step).
These kernels use the CUDA cores only: a first, correct implementation to be measured, not a tuned one.
Every kernel of dsa.cu waits for the previous kernel's writes before it reads them (pdl_begin), so all launch with
programmatic dependent launch where the device has it.
"""
from __future__ import annotations

from pathlib import Path

import cupy as cp
import numpy as np

from openinfer.plugin_api import ForwardBatch
from openinfer.plugin_api.cuda import as_index, clusters_supported, heads3d, launch, rows2d, sm_count, suffix

__all__ = ["glm52_indexer_rope_write", "glm52_indexer_topk", "glm52_sparse_mla_attention"]

SOURCE = Path(__file__).with_name("dsa.cu")
ROPE_THREADS, SCORE_THREADS = 128, 128
SELECT_THREADS, MAX_SELECT_RANKS = 1024, 8        # dsa.cu: indexer_topk_select's block and largest cluster
SELECT_KEYS_PER_RANK = 8192                       # a row is split in segments of at least this many keys
SELECT_STAGE_BYTES = 192 * 1024                   # a segment's order keys up to this size stay in shared memory
                                                  # (with the select's 33 KB of static: under a block's 227 KB)
MAX_INDEX_HEADS, MAX_ROPE_DIM = 64, 1024          # dsa.cu: MAX_INDEX_HEADS, kn[1024]
HG, KT, SPARSE_THREADS, R_PER_THREAD = 16, 32, 256, 32   # dsa.cu: sparse_mla_attention's tiling


def sparse_mla_smem(R: int, P: int) -> int:
    """Bytes of dynamic shared memory of sparse_mla_attention: the heads' queries, a tile of latent rows (padded
    by one), the tile's scores and three per-head softmax values, in float32."""
    D = R + P
    return 4 * (HG * D + KT * (D + 1) + HG * KT + 3 * HG)


def layer_view(cache: cp.ndarray, dim: int, what: str) -> int:
    """A paged cache layer view [blocks, block_size, dim] packed inside a block: its block stride in elements."""
    it = cache.itemsize
    if cache.ndim != 3 or cache.shape[2] != dim or cache.strides[1:] != (dim * it, it):
        raise ValueError(f"{what}: cache must be a layer view [blocks, block_size, {dim}] packed inside a block "
                         f"(got {cache.shape}, strides {cache.strides})")
    return cache.strides[0] // it


def check_batch(batch: ForwardBatch, tokens: int, cache: cp.ndarray | None, what: str) -> None:
    """The host shapes the kernels' index arithmetic relies on, checked without a device read: the grid's `tokens`
    are the batch's (a token past query_start's end would take a position past its sequence's keys), every key of
    a sequence lies inside its block-table row, and the cache's blocks are the batch's. The kernels index with the
    device values unchecked, so a mismatch is a ValueError here rather than an illegal address there."""
    rows, width = batch.block_tables.shape
    if tokens != batch.num_tokens or rows != batch.num_seqs:
        raise ValueError(f"{what}: {tokens} tokens for a batch of {batch.num_tokens} tokens in {batch.num_seqs} "
                         f"sequences ({rows} block-table rows)")
    if width * batch.block_size < batch.max_context_len:
        raise ValueError(f"{what}: block tables of {width} blocks of {batch.block_size} cannot hold the batch's "
                         f"max_context_len {batch.max_context_len}")
    if cache is not None and cache.shape[1] != batch.block_size:
        raise ValueError(f"{what}: cache blocks of {cache.shape[1]} rows for a batch of block_size {batch.block_size}")


def _sequences(batch: ForwardBatch) -> tuple:
    tables = as_index(batch.block_tables, np.int32)
    return (tables, np.int32(tables.strides[0] // tables.itemsize), as_index(batch.query_start, np.int32),
            as_index(batch.context_lens, np.int32), np.int32(batch.num_seqs))


def glm52_indexer_rope_write(q: cp.ndarray, k: cp.ndarray, norm_w: cp.ndarray, norm_b: cp.ndarray,
                             positions: cp.ndarray, cos: cp.ndarray, sin: cp.ndarray, cache: cp.ndarray,
                             slot_mapping: cp.ndarray, interleave: bool) -> cp.ndarray:
    T, heads, dim = q.shape
    if dim > MAX_ROPE_DIM or k.shape != (T, dim) or k.dtype != q.dtype or cache.dtype != q.dtype:
        raise ValueError(f"glm52_indexer_rope_write: q {q.shape} {q.dtype}, k {k.shape} {k.dtype}, cache "
                         f"{cache.dtype}: k must be [T, dim] of q's dtype, dim <= {MAX_ROPE_DIM}")
    block_stride = layer_view(cache, dim, "glm52_indexer_rope_write")
    if positions.shape != (T,) or slot_mapping.shape != (T,):
        raise ValueError(f"glm52_indexer_rope_write: positions {positions.shape} and slot_mapping "
                         f"{slot_mapping.shape} for {T} tokens")
    q3, q_stride = heads3d(q)
    k2, k_stride = rows2d(k)
    out = cp.empty((T, heads, dim), dtype=q.dtype)
    if T == 0:
        return out
    cos = cp.ascontiguousarray(cos, dtype=cp.float32)   # the kernel reads [max_pos, half] float32 rows
    sin = cp.ascontiguousarray(sin, dtype=cp.float32)
    launch(SOURCE, f"indexer_rope_write_{suffix(q.dtype)}", (T,), ROPE_THREADS,
           (q3, np.int64(q_stride), k2, np.int64(k_stride), cp.ascontiguousarray(norm_w),
            cp.ascontiguousarray(norm_b), as_index(positions, np.int32), cos, sin, np.int32(cos.shape[1]), cache,
            np.int64(block_stride), np.int32(cache.shape[1]), as_index(slot_mapping, np.int64), out,
            np.int32(heads), np.int32(dim), np.int32(bool(interleave))), dependent=True)
    return out


def indexer_scores(q: cp.ndarray, weights: cp.ndarray, cache: cp.ndarray, batch: ForwardBatch,
                   scale: float) -> cp.ndarray:
    """[T, max_context_len] float32 scores of every key, -inf where not visible."""
    T, heads, dim = q.shape
    if heads > MAX_INDEX_HEADS:
        raise ValueError(f"glm52_indexer_topk: {heads} indexer heads, the kernel holds at most {MAX_INDEX_HEADS}")
    block_stride = layer_view(cache, dim, "glm52_indexer_topk")
    check_batch(batch, T, cache, "glm52_indexer_topk")
    width = int(batch.max_context_len)
    scores = cp.empty((T, width), dtype=np.float32)
    if T == 0:
        return scores
    tables, table_stride, qstart, lens, B = _sequences(batch)
    launch(SOURCE, f"indexer_scores_{suffix(q.dtype)}", (T, -(-width // SCORE_THREADS)), SCORE_THREADS,
           (cp.ascontiguousarray(q), cp.ascontiguousarray(weights, dtype=np.float32), cache, np.int64(block_stride),
            np.int32(cache.shape[1]), tables, table_stride, qstart, lens, B, scores, np.int32(width), np.int32(heads),
            np.int32(dim), np.float32(scale)), smem=4 * (heads * dim + heads), dependent=True)
    return scores


def glm52_indexer_topk(q: cp.ndarray, weights: cp.ndarray, cache: cp.ndarray, batch: ForwardBatch, topk: int,
                       scale: float) -> cp.ndarray:
    scores = indexer_scores(q, weights, cache, batch, scale)
    return select_topk(scores, batch, cp.empty((q.shape[0], topk), dtype=np.int32))


def select_ranks(tokens: int, width: int, sms: int) -> int:
    """How many CTAs (one cluster) select a row of `width` scores: segments of at least SELECT_KEYS_PER_RANK keys and
    the grid in one wave (a CTA of SELECT_THREADS fills an SM; more rows already fill the GPU), one where clusters
    are not supported."""
    if not clusters_supported():
        return 1
    return max(1, min(MAX_SELECT_RANKS, width // SELECT_KEYS_PER_RANK, sms // max(tokens, 1)))


def select_staged_keys(width: int, ranks: int) -> int:
    """The order keys a select CTA keeps in shared memory: its longest segment's where they fit SELECT_STAGE_BYTES
    (GLM's longest context, ~200k keys, over 8 ranks: 99 KB), else none (every radix pass reads the row)."""
    seg = -(-width // ranks)
    return seg if 4 * seg <= SELECT_STAGE_BYTES else 0


def select_topk(scores: cp.ndarray, batch: ForwardBatch, out: cp.ndarray) -> cp.ndarray:
    """Each token's exact causal top-k of its score row (scores [T, width] float32) into out [T, topk] int32
    (ascending key positions, -1 padded; the reference's tie rule). The grid depends on the shapes only (a
    decode graph's width is the model's length), so it is fixed for a captured graph."""
    check_batch(batch, out.shape[0], None, "glm52_indexer_topk")
    T, width = scores.shape
    if T != out.shape[0] or width < batch.max_context_len:
        raise ValueError(f"glm52_indexer_topk: scores {scores.shape} for {out.shape[0]} tokens of contexts up to "
                         f"{batch.max_context_len} keys")
    if T == 0:
        return out
    _, _, qstart, lens, B = _sequences(batch)
    ranks = select_ranks(T, width, sm_count())
    staged = select_staged_keys(width, ranks)
    launch(SOURCE, "indexer_topk_select", (T * ranks,), SELECT_THREADS,
           (scores, np.int32(width), qstart, lens, B, np.int32(out.shape[1]), np.int32(ranks), np.int32(staged), out),
           smem=4 * staged, cluster=(ranks, 1, 1) if ranks > 1 else None, dependent=True)
    return out


def glm52_sparse_mla_attention(q_latent: cp.ndarray, q_pe: cp.ndarray, cache: cp.ndarray, indices: cp.ndarray,
                               batch: ForwardBatch, scale: float) -> cp.ndarray:
    T, heads, R = q_latent.shape
    P = q_pe.shape[2]
    if R > 16 * R_PER_THREAD or q_pe.shape[:2] != (T, heads) or q_pe.dtype != q_latent.dtype:
        raise ValueError(f"glm52_sparse_mla_attention: q_latent {q_latent.shape}, q_pe {q_pe.shape}: kv_lora_rank "
                         f"must be at most {16 * R_PER_THREAD} and q_pe [T, heads, P] of q_latent's dtype")
    block_stride = layer_view(cache, R + P, "glm52_sparse_mla_attention")
    check_batch(batch, T, cache, "glm52_sparse_mla_attention")
    if indices.shape[0] != T:
        raise ValueError(f"glm52_sparse_mla_attention: a selection of {indices.shape[0]} rows for {T} tokens")
    out = cp.empty((T, heads, R), dtype=q_latent.dtype)
    if T == 0:
        return out
    tables, table_stride, qstart, lens, B = _sequences(batch)
    launch(SOURCE, f"sparse_mla_attention_{suffix(q_latent.dtype)}", (T, -(-heads // HG)), SPARSE_THREADS,
           (cp.ascontiguousarray(q_latent), cp.ascontiguousarray(q_pe), cache, np.int64(block_stride),
            np.int32(cache.shape[1]), tables, table_stride, qstart, lens, B, as_index(indices, np.int32),
            np.int32(indices.shape[1]), out, np.int32(heads), np.int32(R), np.int32(P), np.float32(scale)),
           smem=sparse_mla_smem(R, P), dependent=True)
    return out
