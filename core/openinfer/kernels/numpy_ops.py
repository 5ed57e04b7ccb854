"""numpy reference implementations of the shared ops (float32 compute).

These are both the CPU backend and the specification every CUDA kernel is tested against, so
they favour clarity over speed. Shapes: T tokens, H hidden, nh query heads, nkv KV heads, d head dim.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..engine.batch import ForwardBatch
from ..quant.fp8 import E4M3, e4m3_to_f32, to_e4m3


def embedding(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return table[ids]


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [T, in] @ w[out, in].T -> [T, out] (checkpoint layout, no copy)."""
    return x @ w.T


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
    return (x / np.sqrt(var + eps)) * w


def add_rms_norm(x: np.ndarray, residual: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """residual += x; returns (rms_norm(residual) * w, residual)."""
    residual = residual + x
    return rms_norm(residual, w, eps), residual


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half ("neox") RoPE on the first 2*len(cos) dims of the last axis; the rest pass through."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, rest], axis=-1)


def rope(q: np.ndarray, k: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray
         ) -> tuple[np.ndarray, np.ndarray]:
    """q [T, nh, d], k [T, nkv, d]; cos/sin [max_pos, rotary_dim / 2] tables."""
    c, s = cos[positions], sin[positions]
    return _rotate(q, c, s), _rotate(k, c, s)


def qk_norm_rope(q: np.ndarray, k: np.ndarray, q_w: np.ndarray, k_w: np.ndarray, eps: float,
                 positions: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-head RMSNorm of q and k (Qwen3's QK-norm), then RoPE."""
    return rope(rms_norm(q, q_w, eps), rms_norm(k, k_w, eps), positions, cos, sin)


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    """[T, 2I] -> silu(gate) * up, with gate the first half."""
    gate, up = np.split(gate_up, 2, axis=-1)
    return gate / (1.0 + np.exp(-gate)) * up


def linear_silu_mul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """silu_mul(linear(x, w)) for w = [gate; up] (one fused op on GPUs)."""
    return silu_mul(linear(x, w))


def write_kv(k_cache: np.ndarray, v_cache: np.ndarray, k: np.ndarray, v: np.ndarray, slot_mapping: np.ndarray) -> None:
    """Scatter k/v [T, nkv, d] into paged caches [num_blocks, block_size, nkv, d] at the slots (fp8 caches,
    E4M3 bytes: each value rounded to e4m3, kv_to_cache)."""
    nb, bs = k_cache.shape[:2]
    blocks, offsets = np.divmod(slot_mapping, bs)
    k_cache[blocks, offsets] = kv_to_cache(k, k_cache.dtype)
    v_cache[blocks, offsets] = kv_to_cache(v, v_cache.dtype)


def kv_to_cache(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Keys or values as a cache of `dtype` stores them: e4m3 bytes for an fp8 cache (E4M3), else as they are."""
    return to_e4m3(x) if dtype == E4M3 else x


def kv_from_cache(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cache rows as attention reads them, in the activation `dtype` (an fp8 cache's e4m3 bytes decoded)."""
    return e4m3_to_f32(x).astype(dtype) if x.dtype == E4M3 else x


def rope_write_kv(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_w: np.ndarray | None, k_w: np.ndarray | None,
                  eps: float, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray, k_cache: np.ndarray,
                  v_cache: np.ndarray, slot_mapping: np.ndarray) -> np.ndarray:
    """qk_norm_rope (rope when q_w is None), then write_kv of k and v; returns q (one fused op on GPUs)."""
    if q_w is None:
        q, k = rope(q, k, positions, cos, sin)
    else:
        q, k = qk_norm_rope(q, k, q_w, k_w, eps, positions, cos, sin)
    write_kv(k_cache, v_cache, k, v, slot_mapping)
    return q


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, batch: ForwardBatch,
                    scale: float) -> np.ndarray:
    """Causal GQA attention of each sequence's query run over its paged KV.

    Query j of a run of n tokens sits at position L - n + j of its sequence (L = context length)
    and sees keys 0 .. L - n + j: this one rule covers prefill chunks, prefix hits and decode.
    Reads the batch's array fields, not its host copies (a CUDA graph's decode batch has
    placeholders there; openinfer.engine.batch): on this backend they hold the same values.
    """
    T, nh, d = q.shape
    nkv = k_cache.shape[2]
    group = nh // nkv
    out = np.empty_like(q)
    for start, end, L, blocks in sequence_runs(batch, k_cache.shape[1]):
        n = end - start
        k = kv_from_cache(k_cache[blocks].reshape(-1, nkv, d)[:L], q.dtype)
        v = kv_from_cache(v_cache[blocks].reshape(-1, nkv, d)[:L], q.dtype)
        scores = np.einsum("nkgd,lkd->kgnl", q[start:end].reshape(n, nkv, group, d), k) * scale
        out[start:end] = np.einsum("kgnl,lkd->nkgd", causal_softmax(scores), v).reshape(n, nh, d)
    return out


def sequence_runs(batch: ForwardBatch, block_size: int):
    """(start, end, L, blocks) of each sequence with query tokens in the step: its rows of the flat batch,
    its context length after the step and the blocks holding its KV."""
    qs, lens, tables = np.asarray(batch.query_start), np.asarray(batch.context_lens), batch.block_tables
    for i in range(len(lens)):
        start, end, L = int(qs[i]), int(qs[i + 1]), int(lens[i])
        if end > start:
            yield start, end, L, tables[i, : (L + block_size - 1) // block_size]


def causal_softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over keys of scores [..., n, L] for a run of n queries ending at key L - 1: query j sits at
    position L - n + j and sees keys 0 .. L - n + j."""
    n, L = scores.shape[-2:]
    masked = np.arange(L)[None, :] > (L - n + np.arange(n))[:, None]
    scores = np.where(masked, -np.inf, scores)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return scores / scores.sum(axis=-1, keepdims=True)


def gather_rows(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return x[rows]


def beside(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), which the CUDA backend runs on a side stream beside the ops after it (kernels/cuda/beside.py); on
    the CPU ops run one after another."""
    return fn(*args)


def joined(x: Any) -> Any:
    """x, once what computes it `beside` is done (the CUDA backend's current stream waits for it there)."""
    return x


def register(register_kernel) -> None:
    """Registers every op above for the numpy backend (called through the core's own hookimpl)."""
    for name in ("embedding", "linear", "rms_norm", "add_rms_norm", "rope", "qk_norm_rope", "silu_mul",
                 "linear_silu_mul", "write_kv", "rope_write_kv", "paged_attention", "gather_rows", "beside",
                 "joined"):
        register_kernel(name, "numpy", globals()[name], dtypes=("float32",))
