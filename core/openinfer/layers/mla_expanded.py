"""MLA's expanded ("MHA") form, for steps with runs of several tokens (prefill chunks, prefix hits, mixed steps).

The latent cache stays the single source of truth: the step has written its latents, then each sequence's whole
context (prefix and this run) is gathered from the paged cache (mla_gather_latent: the contexts side by side, and
the identity block table addressing them as blocks of one row, built on the device), decompressed by kv_b_proj in
one GEMM per pass ([rows, R] x [R, h (dn + dv)]: k_nope and v of every head), and packed for the core's paged
prefill attention (paged_attention, MHA with as many KV heads as query heads) at its smallest compiled head dim
`width` >= dn + P and >= dv (256 at DeepSeek's 128 + 64 and 128): Q = [q_nope | q_pe | 0], K = [k_nope | k_pe | 0],
V = [v | 0]. The output's first dv columns go straight to o_proj: no W_UK absorption, no W_UV.

Why, in flops per (query, key, head) at DeepSeek's shapes: the absorbed kernel takes q.k over 576 latent columns
and P.V over 512, 2 x (576 + 512) = 2,176; the expanded one 2 x (192 + 128) = 640 exactly, 2 x (256 + 256) = 1,024
as padded to width 256, and its 128 or 256 wide accumulators allow the attention kernel's large row tiles where
the absorbed kernel's 512-wide ones force 32-row tiles. What it adds, decompressing each context key (2 R (dn + dv)
= 262k flops a head), the absorbed form pays for each query (W_UK and W_UV, the same 262k): equal for a cold
prefill, and for a chunk of n tokens over a prefix it is repaid once n x (2,176 - 1,024) exceeds 262k, n of about
230. Bytes: the packed K and V are 2 x 2 x width bytes a key and head (16 KB a token at 16 heads, 64 KB at 64),
written once and read once per row tile of the attention kernel.

A mixed step's one-token runs (decode rows) take the absorbed form: expanding a decode row's context would cost
262k flops a key and head for one query. Each form runs on a sub-batch of its own runs (their query rows gathered)
and the two outputs meet row by row (each placed over the step's rows by gather_rows, side by side by
mla_pack_heads, one picked a row by gather_rows).

Memory: a pass expands as many heads as fit (heads_per_pass) what a fresh prefill of the step's own T tokens would
hold with every head (T context rows, a table of T entries), and more passes take the rest; the engine's activation
profiling runs a fresh prefill of at least the full token budget (model_runner.dummy_batch: its sequences of equal
length give a table of T entries too, so one pass of every head), so no step needs more than it measured, whatever
its context length. A step whose context is so long that not one head fits
(a short chunk over a long prefix, where the absorbed form is the cheaper one anyway) runs the absorbed form.
"""
from __future__ import annotations

import dataclasses
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


def heads_per_pass(d: MLADims, width: int, tokens: int, rows: int, entries: int) -> int:
    """Most heads one pass may expand over `rows` context rows addressed by a table of `entries` (0: not one) so that
    its buffers hold no more than a fresh prefill of `tokens` tokens with every head. In bf16 elements: per context
    row the gathered latent (R + P), per table entry 2, per row and head the decompressed k_nope and v (dn + dv) and
    the packed K and V (2 width)."""
    row, head = d.latent_dim, d.qk_nope_head_dim + d.v_head_dim + 2 * width
    budget = tokens * (row + 2 + d.num_heads * head)
    return min(d.num_heads, max(0, (budget - rows * row - 2 * entries) // max(1, rows * head)))


def expanded_attention(ops: Any, d: MLADims, q_nope: Array, q_pe: Array, cache: Array, kv_b: Array,
                       batch: ForwardBatch, scale: float, tokens: int) -> Array | None:
    """Causal attention of the batch's queries (q_nope [T, H, dn], rotated q_pe [T, H, P]) over their sequences'
    latent cache [blocks, block_size, R + P], decompressed by kv_b [H (dn + dv), R]: [T, H, dv] packed, or None
    where not one head's expansion fits what a fresh prefill of the step's `tokens` would hold."""
    width = expanded_head_dim(d)
    lens = np.asarray(batch.context_lens_host, np.int64)
    rows = int(lens.sum())
    heads = heads_per_pass(d, width, tokens, rows, len(lens) * int(lens.max(initial=0))) if width else 0
    if heads == 0:
        return None
    H, R, dn, dv = d.num_heads, d.kv_lora_rank, d.qk_nope_head_dim, d.v_head_dim
    heads = -(-H // -(-H // heads))   # the passes balanced
    latents, tables = ops.mla_gather_latent(cache, batch)
    c, k_pe = latents[:, :R], latents[:, R:]
    expanded = dataclasses.replace(batch, block_tables=tables, block_size=1)
    e, outs = dn + dv, []
    for h0 in range(0, H, heads):
        h1 = min(H, h0 + heads)
        kv = ops.linear(c, kv_b[h0 * e: h1 * e]).reshape(rows, h1 - h0, e)
        k = ops.mla_pack_heads([(kv[:, :, :dn], k_pe)], width).reshape(rows, 1, h1 - h0, width)
        v = ops.mla_pack_heads([(kv[:, :, dn:], None)], width).reshape(rows, 1, h1 - h0, width)
        q = ops.mla_pack_heads([(q_nope[:, h0:h1], q_pe[:, h0:h1])], width)
        outs.append((ops.paged_attention(q, k, v, expanded, scale)[:, :, :dv], None))
    return ops.mla_pack_heads(outs, dv)


def sub_batch(ops: Any, batch: ForwardBatch, seqs: np.ndarray) -> tuple[ForwardBatch, np.ndarray]:
    """Sequences `seqs` of the batch as a batch of their own (the fields attention reads: block tables, query starts,
    context lengths), and the step's rows of their runs."""
    qs = np.asarray(batch.query_start_host, np.int64)
    runs = qs[seqs + 1] - qs[seqs]
    starts = np.zeros(len(seqs) + 1, np.int32)
    np.cumsum(runs, out=starts[1:])
    rows = (np.repeat(qs[seqs] - starts[:-1], runs) + np.arange(starts[-1])).astype(np.int32)
    lens = np.asarray(batch.context_lens_host, np.int32)[seqs]
    return dataclasses.replace(batch, block_tables=ops.gather_rows(batch.block_tables, seqs), query_start=starts,
                               context_lens=lens, query_start_host=starts, context_lens_host=lens,
                               max_query_len=int(runs.max()), max_context_len=int(lens.max())), rows


def merge_rows(ops: Any, tokens: int, a: tuple[Array, np.ndarray], b: tuple[Array, np.ndarray]) -> Array:
    """Two outputs [n, H, dv] with their step rows, in the step's order [tokens, H, dv]: each placed over every row,
    side by side, viewed as [2 tokens, H dv] and one picked a row."""
    (xa, rows_a), (xb, rows_b) = a, b
    H, dv = xa.shape[1:]

    def placed(x: Array, rows: np.ndarray) -> Array:
        where = np.zeros(tokens, np.int32)
        where[rows] = np.arange(len(rows))
        return ops.gather_rows(x, where)
    both = ops.mla_pack_heads([(placed(xa, rows_a), None), (placed(xb, rows_b), None)], dv)
    pick = 2 * np.arange(tokens, dtype=np.int32)
    pick[rows_b] += 1
    return ops.gather_rows(both.reshape(2 * tokens, H * dv), pick).reshape(tokens, H, dv)


def prefill_attention(ops: Any, d: MLADims, q_nope: Array, q_pe: Array, cache: Array, kv_b: Array,
                      batch: ForwardBatch, scale: float,
                      absorbed: Callable[[Array, Array, ForwardBatch], Array]) -> Array:
    """[T, H, dv] of a step with runs of several tokens: those in the expanded form, one-token runs among them in
    `absorbed` (the absorbed form of q_nope, q_pe over a batch), everything absorbed where the expansion does not
    fit the step."""
    T = q_nope.shape[0]
    runs = np.diff(batch.query_start_host)
    decode = np.flatnonzero(runs == 1)
    if len(decode) == 0:
        out = expanded_attention(ops, d, q_nope, q_pe, cache, kv_b, batch, scale, T)
        return absorbed(q_nope, q_pe, batch) if out is None else out
    longer, rows = sub_batch(ops, batch, np.flatnonzero(runs > 1))
    out = expanded_attention(ops, d, ops.gather_rows(q_nope, rows), ops.gather_rows(q_pe, rows), cache, kv_b,
                             longer, scale, T)
    if out is None:
        return absorbed(q_nope, q_pe, batch)
    single, single_rows = sub_batch(ops, batch, decode)
    dec = absorbed(ops.gather_rows(q_nope, single_rows), ops.gather_rows(q_pe, single_rows), single)
    return merge_rows(ops, T, (out, rows), (dec, single_rows))
