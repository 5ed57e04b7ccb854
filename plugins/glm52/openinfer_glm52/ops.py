"""numpy reference ops of DeepSeek Sparse Attention (DSA) as GLM-5.x runs it: the lightning
indexer's keys in their own paged cache, its scores with a causal top-k, and MLA attention over the
selected keys only. Registered as `glm52_*` through `register_kernels`; they are the CPU
implementation and the specification every CUDA kernel is tested against, so they favour clarity.

Shapes: T tokens of the flat batch (openinfer.engine.batch.ForwardBatch), Hi indexer heads of Di dims,
P = qk_rope_head_dim rotary dims, H attention heads, R = kv_lora_rank. The indexer cache layer is
[num_blocks, block_size, Di]; the MLA latent cache layer is [num_blocks, block_size, R + P]
(normalised c, then the rotated k_pe). A query j of a run of n tokens sits at position L - n + j
(L = the sequence's context length after the step) and sees keys 0 .. L - n + j.

Selections are key positions within the sequence, [T, index_topk] int32, ascending, padded with
-1: all visible keys when there are at most index_topk of them (attention is then dense), else the
index_topk best. Exact score ties at the cut go to the earlier position (torch.topk, which
transformers uses, leaves ties to its implementation; see the tests for how they compare).
"""
from __future__ import annotations

import numpy as np

from openinfer.plugin_api import ForwardBatch, sequence_runs

INDEXER_NORM_EPS = 1e-6   # the indexer's k_norm is nn.LayerNorm(eps=1e-6) whatever rms_norm_eps says


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleave: bool) -> np.ndarray:
    """RoPE on the first 2 * cos.shape[-1] dims of x [..., d]; the rest pass through. interleave: pairs
    (x0, x1), (x2, x3), … rotate by frequency i and come out as [even…, odd…] (transformers' GLM order);
    else rotate-half: (x_i, x_{i + P/2}) pairs, in place."""
    half = cos.shape[-1]
    rot, rest = x[..., :2 * half], x[..., 2 * half:]
    if interleave:
        a, b = rot[..., 0::2], rot[..., 1::2]
    else:
        a, b = rot[..., :half], rot[..., half:]
    out = np.concatenate([a * cos - b * sin, b * cos + a * sin, rest], axis=-1)
    return out.astype(np.float32)


def glm52_indexer_rope_write(q: np.ndarray, k: np.ndarray, norm_w: np.ndarray, norm_b: np.ndarray,
                             positions: np.ndarray, cos: np.ndarray, sin: np.ndarray, cache: np.ndarray,
                             slot_mapping: np.ndarray, interleave: bool) -> np.ndarray:
    """The indexer's query and key: q [T, Hi, Di] (wq_b of the normalised q_a_proj output), k [T, Di] (wk of
    the layer input). k = LayerNorm(k; norm_w, norm_b, eps 1e-6); RoPE on the first 2 * cos.shape[1] dims of
    q (every head) and k at `positions` (cos/sin [max_pos, P/2] tables); k goes to `cache` [blocks, bs, Di]
    at slot_mapping (a negative slot, a padded token, stores nothing). Returns the rotated q [T, Hi, Di] float32."""
    k = k.astype(np.float32)
    mean = k.mean(axis=-1, keepdims=True)
    var = np.square(k - mean).mean(axis=-1, keepdims=True)
    k = (k - mean) / np.sqrt(var + np.float32(INDEXER_NORM_EPS)) * norm_w + norm_b
    c, s = cos[positions], sin[positions]                         # [T, P/2]
    k = _rotate(k, c, s, interleave)
    slots = np.asarray(slot_mapping)
    blocks, offsets = np.divmod(slots[slots >= 0], cache.shape[1])   # cache is a strided layer view
    cache[blocks, offsets] = k[slots >= 0]
    return _rotate(q.astype(np.float32), c[:, None, :], s[:, None, :], interleave)


def _sequence_keys(cache: np.ndarray, blocks: np.ndarray, length: int) -> np.ndarray:
    """The first `length` tokens' rows of one sequence's paged cache layer (its blocks in order): [length, D]."""
    return cache[blocks].reshape(-1, cache.shape[-1])[:length]


def glm52_indexer_scores(q: np.ndarray, weights: np.ndarray, keys: np.ndarray, scale: float) -> np.ndarray:
    """I(t, s) = sum_h weights[t, h] * relu(q[t, h] · keys[s] * scale): q [n, Hi, Di], weights [n, Hi]
    (weights_proj output times Hi^-0.5), keys [L, Di] -> [n, L] float32 (no mask)."""
    dots = np.einsum("nhd,ld->nhl", q.astype(np.float32), keys.astype(np.float32)) * np.float32(scale)
    return np.einsum("nh,nhl->nl", weights.astype(np.float32), np.maximum(dots, np.float32(0)))


def select_topk(scores: np.ndarray, visible: int, topk: int) -> np.ndarray:
    """The selection of one query whose keys 0 .. visible-1 are visible: [topk] int32 ascending, -1 padded.
    Ties at the cut go to the earlier position (a stable sort on the negated score)."""
    out = np.full(topk, -1, dtype=np.int32)
    if visible <= topk:
        out[:visible] = np.arange(visible, dtype=np.int32)
        return out
    best = np.argsort(-scores[:visible], kind="stable")[:topk]
    out[:] = np.sort(best)
    return out


def glm52_indexer_topk(q: np.ndarray, weights: np.ndarray, cache: np.ndarray, batch: ForwardBatch, topk: int,
                       scale: float) -> np.ndarray:
    """Each query's `topk` best keys under the causal mask: q [T, Hi, Di] rotated (glm52_indexer_rope_write),
    weights [T, Hi] float32 (weights_proj output times Hi^-0.5), cache [blocks, bs, Di] holding this step's
    keys already. Returns [T, topk] int32 key positions (module docstring)."""
    out = np.full((q.shape[0], topk), -1, dtype=np.int32)
    for start, end, L, blocks in sequence_runs(batch, cache.shape[1]):
        n = end - start
        scores = glm52_indexer_scores(q[start:end], weights[start:end], _sequence_keys(cache, blocks, L), scale)
        for j in range(n):
            out[start + j] = select_topk(scores[j], L - n + j + 1, topk)
    return out


def glm52_sparse_mla_attention(q_latent: np.ndarray, q_pe: np.ndarray, cache: np.ndarray, indices: np.ndarray,
                               batch: ForwardBatch, scale: float) -> np.ndarray:
    """Absorbed MLA attention of each query over its selected keys only: q_latent [T, H, R] (q_nope times
    W_UK), q_pe [T, H, P] rotated, cache [blocks, bs, R + P], indices [T, K] key positions (-1: none;
    positions past the query's own are ignored too). score_h(t, s) = (q_latent·c_s + q_pe·kpe_s) * scale
    over s in the selection; returns softmax · c [T, H, R] float32."""
    T, H, R = q_latent.shape
    out = np.zeros((T, H, R), dtype=np.float32)
    for start, end, L, blocks in sequence_runs(batch, cache.shape[1]):
        n = end - start
        rows = _sequence_keys(cache, blocks, L).astype(np.float32)
        for j in range(n):
            t = start + j
            sel = indices[t][(indices[t] >= 0) & (indices[t] <= L - n + j)]
            c, kpe = rows[sel, :R], rows[sel, R:]
            scores = (np.einsum("hr,sr->hs", q_latent[t].astype(np.float32), c)
                      + np.einsum("hp,sp->hs", q_pe[t].astype(np.float32), kpe)) * np.float32(scale)
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            out[t] = probs @ c
    return out


OPS = ("glm52_indexer_rope_write", "glm52_indexer_topk", "glm52_sparse_mla_attention")
