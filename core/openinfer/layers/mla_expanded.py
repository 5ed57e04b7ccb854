"""MLA's expanded ("MHA") form, for steps with runs of several tokens (prefill chunks, prefix hits, mixed steps).

The latent cache stays the single source of truth: the step has written its latents, then each sequence's whole
context (prefix and this run) is gathered from the paged cache (mla_gather_latent), decompressed by kv_b_proj in
one GEMM per pass ([rows, R] x [R, h (dn + dv)]: k_nope and v of every head), and packed for the core's paged
prefill attention (paged_attention, MHA with as many KV heads as query heads) at its smallest compiled head dim
`width` >= dn + P and >= dv (256 at DeepSeek's 128 + 64 and 128): Q = [q_nope | q_pe | 0], K = [k_nope | k_pe | 0],
V = [v | 0], each context's rows side by side, addressed as blocks of one row by an identity block table. The
output's first dv columns go straight to o_proj: no W_UK absorption, no W_UV.

Why, in flops per (query, key, head) at DeepSeek's shapes: the absorbed kernel takes q.k over 576 latent columns
and P.V over 512, 2 x (576 + 512) = 2,176; the expanded one 2 x (192 + 128) = 640 exactly, 2 x (256 + 256) = 1,024
as padded to width 256, and its 128 or 256 wide accumulators allow the attention kernel's large row tiles where
the absorbed kernel's 512-wide ones force 32-row tiles. What it adds, decompressing each context key (2 R (dn + dv)
= 262k flops a head), the absorbed form pays for each query (W_UK and W_UV, the same 262k): equal for a cold
prefill, and for a chunk of n tokens over a prefix it is repaid once n x (2,176 - 1,024) exceeds 262k, n of about
230. Bytes: the packed K and V are 2 x 2 x width bytes a key and head (16 KB a token at 16 heads, 64 KB at 64),
written once and read once per row tile of the attention kernel.

A mixed step's one-token runs (decode rows) take the absorbed form on a sub-batch of their own: expanding a decode
row's context would cost 262k flops a key and head for one query. The expanded pass gives them a context of one key
(one row: cheap, finite, discarded) and the two outputs meet row by row (mla_pack_heads side by side, then
gather_rows).

Memory: a pass expands as many heads as fit (heads_per_pass) what a fresh prefill of the step's own T tokens would
hold with every head (T context rows), and more passes take the rest; the engine's activation profiling runs a
fresh prefill of at least the full token budget (model_runner.dummy_batch: one pass of every head), so no step
needs more than it measured, whatever its context length. A step whose context is so long that not one head fits
(a short chunk over a long prefix, where the absorbed form is the cheaper one anyway) runs the absorbed form.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..engine.batch import Array, ForwardBatch

if TYPE_CHECKING:
    from .mla import MLADims

HEAD_DIMS = (64, 128, 256)   # the head dims paged_attention compiles


def expanded_head_dim(d: MLADims) -> int | None:
    """The smallest compiled head dim holding [q_nope | q_pe] and v; None when none does."""
    need = max(d.qk_head_dim, d.v_head_dim)
    return next((w for w in HEAD_DIMS if w >= need), None)


@dataclass(frozen=True)
class ContextLayout:
    """Each sequence's context in the expanded buffers: rows starts[i] .. starts[i + 1], addressed as blocks of one
    row (`tables`: row starts[i] + j for position j, 0 past the context, as the batch's tables are padded), so that
    no row is padding and a one-token context takes one row."""
    starts: np.ndarray    # [B + 1] int64
    tables: np.ndarray    # [B, max context] int32

    @staticmethod
    def of(batch: ForwardBatch) -> ContextLayout:
        lens = np.asarray(batch.context_lens_host, np.int64)
        starts = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=starts[1:])
        cols = np.arange(int(lens.max(initial=1)))
        return ContextLayout(starts, np.where(cols < lens[:, None], starts[:-1, None] + cols, 0).astype(np.int32))

    @property
    def rows(self) -> int:
        return int(self.starts[-1])


def heads_per_pass(d: MLADims, width: int, tokens: int, rows: int) -> int:
    """Most heads one pass may expand over `rows` context rows (0: not one) so that its buffers hold no more than a
    fresh prefill of `tokens` tokens with every head: per context row the gathered latent (R + P), per row and head
    the decompressed k_nope and v (dn + dv) and the packed K and V (2 width)."""
    row, head = d.latent_dim, d.qk_nope_head_dim + d.v_head_dim + 2 * width
    budget = tokens * (row + d.num_heads * head)
    return min(d.num_heads, max(0, (budget - rows * row) // (rows * head)))


def expanded_attention(ops: Any, d: MLADims, q_nope: Array, q_pe: Array, cache: Array, kv_b: Array,
                       batch: ForwardBatch, scale: float) -> Array | None:
    """Causal attention of the step's queries (q_nope [T, H, dn], rotated q_pe [T, H, P]) over their sequences'
    latent cache [blocks, block_size, R + P], decompressed by kv_b [H (dn + dv), R]: [T, H, dv] packed, or None
    where not one head's expansion fits the step (the caller runs the absorbed form)."""
    width = expanded_head_dim(d)
    layout = ContextLayout.of(batch)
    H, R, dn, dv = d.num_heads, d.kv_lora_rank, d.qk_nope_head_dim, d.v_head_dim
    heads = heads_per_pass(d, width, q_nope.shape[0], layout.rows) if width else 0
    if heads == 0:
        return None
    heads = -(-H // -(-H // heads))   # the passes balanced
    latents = ops.mla_gather_latent(cache, batch, layout.starts)
    c, k_pe = latents[:, :R], latents[:, R:]
    expanded = dataclasses.replace(batch, block_tables=layout.tables, block_size=1)
    e, outs = dn + dv, []
    for h0 in range(0, H, heads):
        h1 = min(H, h0 + heads)
        kv = ops.linear(c, kv_b[h0 * e: h1 * e]).reshape(layout.rows, h1 - h0, e)
        blocks = (layout.rows, 1, h1 - h0, width)
        k = ops.mla_pack_heads([(kv[:, :, :dn], k_pe)], width).reshape(blocks)
        v = ops.mla_pack_heads([(kv[:, :, dn:], None)], width).reshape(blocks)
        q = ops.mla_pack_heads([(q_nope[:, h0:h1], q_pe[:, h0:h1])], width)
        outs.append((ops.paged_attention(q, k, v, expanded, scale)[:, :, :dv], None))
    return ops.mla_pack_heads(outs, dv)


def prefill_attention(ops: Any, d: MLADims, q_nope: Array, q_pe: Array, cache: Array, kv_b: Array,
                      batch: ForwardBatch, scale: float,
                      absorbed: Callable[[Array, Array, ForwardBatch], Array]) -> Array:
    """[T, H, dv] of a step with runs of several tokens: those in the expanded form, one-token runs among them in
    `absorbed` (the absorbed form of q_nope, q_pe over a batch), everything absorbed where the expansion does not
    fit the step."""
    runs = np.diff(batch.query_start_host)
    single = runs == 1
    alone = np.where(single, 1, batch.context_lens_host).astype(np.int32)   # a one-token run sees one key here
    expanded_batch = dataclasses.replace(batch, context_lens=alone, context_lens_host=alone,
                                         max_context_len=int(alone.max())) if single.any() else batch
    out = expanded_attention(ops, d, q_nope, q_pe, cache, kv_b, expanded_batch, scale)
    if out is None:
        return absorbed(q_nope, q_pe, batch)
    if not single.any():
        return out
    seqs = np.flatnonzero(single).astype(np.int32)
    rows = batch.query_start_host[seqs]
    lens = np.asarray(batch.context_lens_host, np.int32)[seqs]
    qs = np.arange(len(seqs) + 1, dtype=np.int32)
    decode = dataclasses.replace(batch, block_tables=ops.gather_rows(batch.block_tables, seqs), query_start=qs,
                                 context_lens=lens, query_start_host=qs, context_lens_host=lens, max_query_len=1,
                                 max_context_len=int(lens.max()))   # the fields attention reads
    dec = absorbed(ops.gather_rows(q_nope, rows), ops.gather_rows(q_pe, rows), decode)
    T, H, dv = out.shape
    place = np.zeros(T, np.int32)
    place[rows] = np.arange(len(rows))
    pick = 2 * np.arange(T, dtype=np.int32)   # row t of [out | dec placed] side by side, viewed as [2 T, H dv]
    pick[rows] += 1
    both = ops.mla_pack_heads([(out, None), (ops.gather_rows(dec, place), None)], dv).reshape(2 * T, H * dv)
    return ops.gather_rows(both, pick).reshape(T, H, dv)
