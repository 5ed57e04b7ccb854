"""numpy references of the MLA and MoE ops (float32 compute): the CPU backend and the specification
the CUDA kernels are tested against.

MLA (layers/mla.py): a paged latent cache of R + P values per token per layer (the normalised compressed
KV c, then the rotated shared k_pe); decode attention runs in the absorbed form over the latents, longer runs
in the expanded form (layers/mla_expanded.py: the context's latents gathered, decompressed, packed into heads
for paged_attention).
MoE (layers/moe.py): router -> top-k experts -> weighted sum of SwiGLU experts held stacked [E, ...].
Shapes: T tokens, H heads, R kv_lora_rank, P qk_rope_head_dim, D hidden, E experts, I expert width.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..engine.batch import ForwardBatch
from .numpy_ops import causal_softmax, rms_norm, sequence_runs

if TYPE_CHECKING:
    from ..layers.moe import RouterConfig


def mla_rope(q_pe: np.ndarray, k_pe: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek's interleaved RoPE: pairs (x0, x1), (x2, x3), ... turn by frequency i, and the output
    keeps the interleaved order. q_pe [T, H, P], k_pe [T, P] (one head shared by all query heads);
    cos/sin [max_pos, P / 2] tables (layers/rope.py, YaRN's attention factor folded in)."""
    c, s = cos[positions], sin[positions]
    return _rotate_pairs(q_pe, c[:, None, :], s[:, None, :]), _rotate_pairs(k_pe, c, s)


def _rotate_pairs(x: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty(x.shape, dtype=np.result_type(x, c))
    out[..., 0::2] = even * c - odd * s
    out[..., 1::2] = odd * c + even * s
    return out


def mla_write_latent(cache: np.ndarray, c: np.ndarray, k_pe: np.ndarray, slot_mapping: np.ndarray) -> None:
    """Scatter [c | k_pe] (c [T, R], k_pe [T, P] rotated) into the latent cache [blocks, block_size, R + P]."""
    R = c.shape[-1]
    blocks, offsets = np.divmod(slot_mapping, cache.shape[1])
    cache[blocks, offsets, :R] = c
    cache[blocks, offsets, R:] = k_pe


def mla_rope_write(q_pe: np.ndarray, kv: np.ndarray, norm_w: np.ndarray, eps: float, positions: np.ndarray,
                   cos: np.ndarray, sin: np.ndarray, cache: np.ndarray, slot_mapping: np.ndarray) -> np.ndarray:
    """A step's latents into the cache and its rotated q_pe, as one op (a backend may run it as one launch; CUDA
    does): kv [T, R + P] is kv_a_proj_with_mqa's output, c = rms_norm(kv[:, :R]) * norm_w and k_pe = kv[:, R:]
    rotated are written (mla_write_latent), q_pe [T, H, P] rotated is returned (mla_rope)."""
    R = norm_w.shape[-1]
    q_rot, k_rot = mla_rope(q_pe, kv[:, R:], positions, cos, sin)
    mla_write_latent(cache, rms_norm(kv[:, :R], norm_w, eps), k_rot, slot_mapping)
    return q_rot


def mla_attention(q_latent: np.ndarray, q_pe: np.ndarray, cache: np.ndarray, batch: ForwardBatch,
                  scale: float) -> np.ndarray:
    """Absorbed MLA over the paged latents: score(t, j) = (q_latent[t]·c_j + q_pe[t]·kpe_j) * scale,
    out[t] = softmax_j(score) · c_j, [T, H, R]. q_latent [T, H, R] is q_nope times W_UK; q_pe [T, H, P]
    rotated. The causal rule is paged_attention's: query j of a run of n sits at position L - n + j
    and sees keys 0 .. L - n + j (decode, prefill chunks and prefix hits alike)."""
    R = q_latent.shape[-1]
    out = np.empty_like(q_latent)
    for start, end, L, blocks in sequence_runs(batch, cache.shape[1]):
        latents = cache[blocks].reshape(-1, cache.shape[-1])[:L]
        c, kpe = latents[:, :R], latents[:, R:]
        scores = (np.einsum("nhr,lr->hnl", q_latent[start:end], c)
                  + np.einsum("nhp,lp->hnl", q_pe[start:end], kpe)) * scale
        out[start:end] = np.einsum("hnl,lr->nhr", causal_softmax(scores), c)
    return out


def mla_gather_latent(cache: np.ndarray, batch: ForwardBatch) -> tuple[np.ndarray, np.ndarray]:
    """Every sequence's context latents side by side, [sum of context_lens, R + P] (sequence i's positions 0 ..
    L_i - 1 from row starts[i], the running sum of the lengths before it), and the block table addressing them as
    blocks of one row: [B, max L] int32, tables[i, j] = starts[i] + j, 0 past the context (as batch tables pad)."""
    bs, tables, lens = cache.shape[1], np.asarray(batch.block_tables), np.asarray(batch.context_lens_host, np.int64)
    starts = np.concatenate(([0], np.cumsum(lens)))
    out = np.empty((int(starts[-1]), cache.shape[-1]), dtype=cache.dtype)
    for i, L in enumerate(lens.tolist()):
        out[starts[i]: starts[i] + L] = cache[tables[i, : -(-L // bs)]].reshape(-1, cache.shape[-1])[:L]
    cols = np.arange(int(lens.max(initial=0)))
    return out, np.where(cols < lens[:, None], starts[:-1, None] + cols, 0).astype(np.int32)


def mla_pack_heads(parts: list[tuple[np.ndarray, np.ndarray | None]], width: int) -> np.ndarray:
    """Heads side by side, each row [a | b | zeros] of `width`: for each part, a [N, h, da] and b [N, h, db] (or
    [N, db], one row every head shares, as k_pe; or None), concatenated over the parts' heads: [N, sum h, width].
    The expanded form's Q = [q_nope | q_pe | 0], K = [k_nope | k_pe | 0], V = [v | 0], and its output's columns."""
    packed = []
    for a, b in parts:
        n, h, _ = a.shape
        pieces = [a] if b is None else [a, np.broadcast_to(b[:, None, :], (n, h, b.shape[-1])) if b.ndim == 2 else b]
        used = sum(p.shape[-1] for p in pieces)
        if used > width:
            raise ValueError(f"mla_pack_heads: {used} columns do not fit width {width}")
        packed.append(np.concatenate(pieces + [np.zeros((n, h, width - used), dtype=a.dtype)], axis=-1))
    return np.concatenate(packed, axis=1)


def per_head_linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A linear map of its own per head: x [T, H, in], w [H, out, in] -> [T, H, out]. MLA uses it to
    absorb W_UK into the query (w = W_UK transposed, [H, R, dn]) and to expand the latent output with
    W_UV ([H, dv, R])."""
    return np.einsum("thi,hoi->tho", x, w)


def router_logits(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The MoE gate in float32 whatever the model dtype (as the reference computes it): x [T, D],
    w [E, D] float32 -> [T, E] float32."""
    return np.asarray(x, dtype=np.float32) @ np.asarray(w, dtype=np.float32).T


def moe_route(logits: np.ndarray, bias: np.ndarray | None, cfg: RouterConfig) -> tuple[np.ndarray, np.ndarray]:
    """Router logits [T, E] -> (expert ids [T, k] int32, weights [T, k] float32), as transformers routes:

    greedy: top-k of the scores. group_limited_greedy (DeepSeek-V2): a group scores its best expert, the
    topk_group best groups stay and the others' scores become 0, then top-k. noaux_tc (DeepSeek-V3, Kimi):
    experts are chosen on scores + bias (e_score_correction_bias), a group scores the sum of its two best
    biased scores, groups not kept become -inf; the weights are the unbiased scores. Then optionally
    normalised to sum 1 (norm_topk_prob) and multiplied by routed_scaling_factor."""
    logits = np.asarray(logits, dtype=np.float32)
    if cfg.scoring == "softmax":
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        scores = e / e.sum(axis=-1, keepdims=True)
    else:
        scores = 1.0 / (1.0 + np.exp(-logits))
    T, E = scores.shape
    choice = scores if bias is None else scores + np.asarray(bias, dtype=np.float32)
    if cfg.method in ("group_limited_greedy", "noaux_tc") and cfg.n_group > 1:
        grouped = choice.reshape(T, cfg.n_group, E // cfg.n_group)
        if cfg.method == "group_limited_greedy":
            group_scores, fill = grouped.max(axis=-1), 0.0
        else:
            group_scores, fill = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1), -np.inf
        kept = np.argsort(-group_scores, axis=-1, kind="stable")[:, : cfg.topk_group]
        keep = np.zeros((T, cfg.n_group), dtype=bool)
        np.put_along_axis(keep, kept, True, axis=-1)
        choice = np.where(np.repeat(keep, E // cfg.n_group, axis=-1), choice, np.float32(fill))
    ids = np.argsort(-choice, axis=-1, kind="stable")[:, : cfg.top_k]
    weights = np.take_along_axis(scores, ids, axis=-1)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
    return ids.astype(np.int32), (weights * np.float32(cfg.routed_scaling_factor)).astype(np.float32)


def moe_router(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, cfg: RouterConfig
               ) -> tuple[np.ndarray, np.ndarray]:
    """moe_route(router_logits(x, w), bias, cfg): the MoE layer's router as one op, which a backend may run as one
    launch (CUDA does)."""
    return moe_route(router_logits(x, w), bias, cfg)


def moe_experts(x: np.ndarray, gate_up: np.ndarray, down: np.ndarray, ids: np.ndarray, weights: np.ndarray,
                expert_offset: int, addend: np.ndarray | None = None) -> np.ndarray:
    """y[t] = sum over k of weights[t, k] * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, k], over the
    experts this rank holds: gate_up [E_local, 2I, D] (gate rows first), down [E_local, D, I] are experts
    expert_offset .. expert_offset + E_local - 1; a selected expert outside that range adds nothing (its
    rank adds it; the communicator sums the ranks). `addend` [T, D] (the shared experts' output), if given, is
    added to that sum in float32 before the result is rounded to x's dtype."""
    y = np.zeros(x.shape, np.result_type(x, np.float32))
    local = ids.astype(np.int64) - expert_offset
    for e in np.unique(local[(local >= 0) & (local < gate_up.shape[0])]):
        rows, slot = np.nonzero(local == e)
        gate, up = np.split(x[rows] @ gate_up[e].T, 2, axis=-1)
        h = (gate / (1.0 + np.exp(-gate)) * up) @ down[e].T
        y[rows] += h * weights[rows, slot][:, None]
    return with_addend(y, addend).astype(x.dtype, copy=False)


def with_addend(y: np.ndarray, addend: np.ndarray | None) -> np.ndarray:
    """The routed sum y (float32 or wider) plus moe_experts' optional addend, at y's precision."""
    return y if addend is None else y + np.asarray(addend, y.dtype)


def register(register_kernel) -> None:
    """Registers every op above for the numpy backend (called through the core's own hookimpl)."""
    for name in ("mla_rope", "mla_write_latent", "mla_rope_write", "mla_attention", "mla_gather_latent",
                 "mla_pack_heads", "per_head_linear", "router_logits", "moe_route", "moe_router", "moe_experts"):
        register_kernel(name, "numpy", globals()[name], dtypes=("float32",))
