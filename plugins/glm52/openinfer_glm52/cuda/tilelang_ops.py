"""TileLang implementations of glm52_sparse_mla_attention and glm52_indexer_topk (tilelang_module.py loads the
kernels): the numpy reference signatures (../ops.py) on CuPy arrays. They take bf16 at GLM-5.x's widths (latent
512 + rope 64; indexer 32 heads of 128 dims) and hand every other call to the hand-written kernels of ops.py.

- Sparse MLA: sparse_rows turns each selected key position into its cache row (-1: none), sparse_mla attends over
  the selection split in `splits` parts (flash-decoding: blocks for the GPU at small decode batches), and
  sparse_mla_combine merges the parts into bf16. The split follows from the selection's width alone, never from the
  batch, so a token's output bits (and greedy output) do not depend on what it is batched or chunked with; the batch
  decides only how many of a token's parts one block takes in turn (splits_per_block).
- Indexer: indexer_scores writes every key's score (-inf where not visible), topk_select picks each token's exact
  top-k (radix select, then one block scan a chunk of keys to place them in order). "tilelang+nvrtc" pairs the
  TileLang scores with the hand-written select.
"""
from __future__ import annotations

import cupy as cp
import ml_dtypes
import numpy as np

from openinfer.plugin_api import ForwardBatch
from openinfer.plugin_api.cuda import as_index, sm_count

from . import ops as nvrtc
from .tilelang_module import launch

__all__ = ["glm52_indexer_topk", "glm52_indexer_topk_nvrtc_select", "glm52_sparse_mla_attention"]

BF16 = np.dtype(ml_dtypes.bfloat16)
R, P, HEAD_BLOCK, BI, ROWS_THREADS = 512, 64, 64, 64, 128     # kernels_src/programs.py
INDEX_HEADS, INDEX_DIM, BN = 32, 128, 128
SPLIT_KEYS = 256           # selected keys a split (splits_for)
PARTIAL_BYTES = 128 << 20  # the split outputs of one pass stay under this (longer prefills go in passes)


def splits_for(topk: int) -> int:
    """How many parts each token's selection is split into: one per SPLIT_KEYS keys of the selection's width (8 at
    GLM-5's top-2048). A function of the width alone keeps the bits batch-invariant; its size weighs decode at batch
    1 (more blocks) against prefill (each part writes a float32 output row a head), by a sweep of
    scripts/glm52_dsa_times.py."""
    return max(1, -(-topk // SPLIT_KEYS))


def splits_per_block(splits: int, blocks: int, sms: int) -> int:
    """How many of a token's `splits` parts one sparse_mla block computes in turn (a divisor of splits), for `blocks`
    blocks a part: the fewest that keep the grid in one wave of a block an SM (sparse_mla's shared memory holds one).
    Each part starts from fresh accumulators, so this changes the grid, not a bit."""
    for per in range(1, splits + 1):
        if splits % per == 0 and blocks * (splits // per) <= sms:
            return per
    return splits


def token_sequences(batch: ForwardBatch) -> cp.ndarray:
    """[T] int32: the sequence of each token of the flat batch."""
    T = batch.num_tokens
    if batch.max_query_len == 1 and T == batch.num_seqs:   # decode: token i is sequence i, query_start[i] is i
        return as_index(batch.query_start, np.int32)[:T]
    ends = as_index(batch.query_start, np.int32)[1:]
    return cp.searchsorted(ends, cp.arange(T, dtype=np.int32), side="right").astype(np.int32)


def _paging(batch: ForwardBatch, cache: cp.ndarray, block_stride: int) -> dict:
    """The kernels' view of the paged cache layer and the batch's block tables (programs.py's docstring)."""
    tables = cp.ascontiguousarray(as_index(batch.block_tables, np.int32))
    block_rows = block_stride // cache.shape[2]
    return dict(BlockTable=tables, n_seq=tables.shape[0], block_size=cache.shape[1], block_rows=block_rows,
                kv_rows=(cache.shape[0] - 1) * block_rows + cache.shape[1])


def glm52_sparse_mla_attention(q_latent: cp.ndarray, q_pe: cp.ndarray, cache: cp.ndarray, indices: cp.ndarray,
                               batch: ForwardBatch, scale: float) -> cp.ndarray:
    T, H, width = q_latent.shape
    if not (q_latent.dtype == q_pe.dtype == cache.dtype == BF16 and width == R and q_pe.shape == (T, H, P)):
        return nvrtc.glm52_sparse_mla_attention(q_latent, q_pe, cache, indices, batch, scale)
    block_stride = nvrtc.layer_view(cache, R + P, "glm52_sparse_mla_attention")
    nvrtc.check_batch(batch, T, cache, "glm52_sparse_mla_attention")
    topk = indices.shape[1]
    if T == 0 or topk == 0:   # no selection: no key to attend to, as the hand-written kernel gives
        return cp.zeros((T, H, R), dtype=BF16)
    out = cp.empty((T, H, R), dtype=BF16)
    paging = _paging(batch, cache, block_stride)
    rows = cp.empty((T, topk), dtype=np.int32)
    launch("sparse_rows", (T, -(-topk // ROWS_THREADS)),
           dict(Indices=cp.ascontiguousarray(as_index(indices, np.int32)),
                Positions=as_index(batch.positions, np.int32),
                TokenSeq=token_sequences(batch), BlockTable=paging["BlockTable"], block_size=paging["block_size"],
                block_rows=paging["block_rows"], n_seq=paging["n_seq"], t_n=T, topk=topk,
                width=paging["BlockTable"].shape[1], Rows=rows))
    ql, qp = cp.ascontiguousarray(q_latent), cp.ascontiguousarray(q_pe)
    splits = splits_for(topk)
    step = max(1, PARTIAL_BYTES // (splits * H * R * 4))
    for t0 in range(0, T, step):
        n = min(step, T - t0)
        part = cp.empty((splits, n, H, R), dtype=np.float32)
        lse = cp.empty((splits, n, H), dtype=np.float32)
        per = splits_per_block(splits, n * -(-H // HEAD_BLOCK), sm_count())
        launch("sparse_mla", (n, -(-H // HEAD_BLOCK), splits // per),
               dict(QL=ql[t0:t0 + n], QP=qp[t0:t0 + n], KV=cache, Rows=rows[t0:t0 + n], scale=scale, per=per,
                    OPart=part, LsePart=lse, heads=H, kv_rows=paging["kv_rows"], splits=splits, t_n=n, topk=topk))
        launch("sparse_mla_combine", (n, H), dict(OPart=part, LsePart=lse, Out=out[t0:t0 + n], heads=H,
                                                  splits=splits, t_n=n))
    return out


def _indexer_scores(q: cp.ndarray, weights: cp.ndarray, cache: cp.ndarray, batch: ForwardBatch,
                    scale: float) -> cp.ndarray:
    """[T, max_context_len] float32 scores of every key, -inf where not visible."""
    T, dim = q.shape[0], q.shape[2]
    block_stride = nvrtc.layer_view(cache, dim, "glm52_indexer_topk")
    nvrtc.check_batch(batch, T, cache, "glm52_indexer_topk")
    width = int(batch.max_context_len)
    scores = cp.empty((T, width), dtype=np.float32)
    paging = _paging(batch, cache, block_stride)
    launch("indexer_scores", (T, -(-width // BN)),
           dict(Q=cp.ascontiguousarray(q), W=cp.ascontiguousarray(weights, dtype=np.float32), K=cache,
                Positions=as_index(batch.positions, np.int32), TokenSeq=token_sequences(batch),
                BlockTable=paging["BlockTable"], block_size=paging["block_size"], block_rows=paging["block_rows"],
                kv_rows=paging["kv_rows"], n_seq=paging["n_seq"], scale=scale, t_n=T,
                tw=paging["BlockTable"].shape[1], width=width, Scores=scores))
    return scores


def select_topk(scores: cp.ndarray, batch: ForwardBatch, out: cp.ndarray) -> cp.ndarray:
    """The TileLang exact select: each token's causal top-k of its score row into out [T, topk] (ascending key
    positions, -1 padded, ties at the cut to the earlier key)."""
    launch("topk_select", (out.shape[0],), dict(Scores=scores, Positions=as_index(batch.positions, np.int32), Out=out,
                                                t_n=out.shape[0], topk=out.shape[1], width=scores.shape[1]))
    return out


def _indexer_topk(q, weights, cache, batch, topk, scale, select) -> cp.ndarray:
    T, heads, dim = q.shape
    if not (q.dtype == cache.dtype == BF16 and heads == INDEX_HEADS and dim == INDEX_DIM):
        return nvrtc.glm52_indexer_topk(q, weights, cache, batch, topk, scale)
    out = cp.empty((T, topk), dtype=np.int32)
    if T == 0 or topk == 0:
        return out
    return select(_indexer_scores(q, weights, cache, batch, scale), batch, out)


def glm52_indexer_topk(q: cp.ndarray, weights: cp.ndarray, cache: cp.ndarray, batch: ForwardBatch, topk: int,
                       scale: float) -> cp.ndarray:
    """TileLang scores, TileLang select."""
    return _indexer_topk(q, weights, cache, batch, topk, scale, select_topk)


def glm52_indexer_topk_nvrtc_select(q: cp.ndarray, weights: cp.ndarray, cache: cp.ndarray, batch: ForwardBatch,
                                    topk: int, scale: float) -> cp.ndarray:
    """TileLang scores, the hand-written select (registered as "tilelang+nvrtc")."""
    return _indexer_topk(q, weights, cache, batch, topk, scale, nvrtc.select_topk)
