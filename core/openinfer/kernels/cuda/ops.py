"""CUDA wrappers of the shared ops: the numpy reference signatures, on CuPy arrays (bf16 or f32).

Each wrapper checks layouts, picks a launch shape and launches on the current stream; strided
views (a slice of the fused qkv output, a layer's slice of the KV pool) are used in place.
`linear` lives in blas.py and `paged_attention`'s implementations in attention.py.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ...quant.fp8 import E4M3
from .blas import gemv_silu_mul, linear
from .module import NULL, as_index, heads3d, launch, rows2d, suffix

__all__ = ["embedding", "linear", "rms_norm", "add_rms_norm", "rope", "qk_norm_rope", "silu_mul", "linear_silu_mul",
           "write_kv", "rope_write_kv", "gather_rows", "argmax", "top_logprobs"]


def _threads(n: int, cap: int = 1024) -> int:
    """A block size covering n elements, a multiple of 32."""
    return max(32, min(cap, (n + 31) // 32 * 32))


def gather_rows(x: cp.ndarray, rows) -> cp.ndarray:
    """x[rows] for x [N, ...]: copies whole rows in the widest aligned unit (any dtype)."""
    rows = as_index(rows, np.int32)
    if not x[:1].flags.c_contiguous:  # rows must be packed inside; the row stride may be anything
        x = cp.ascontiguousarray(x)
    out = cp.empty((rows.shape[0], *x.shape[1:]), dtype=x.dtype)
    row_bytes = out[0].nbytes if out.size else 0
    if row_bytes == 0 or rows.shape[0] == 0:
        return out
    stride = x.strides[0] if x.ndim > 1 else x.itemsize
    unit = next(u for u in (16, 4, 2, 1) if (row_bytes | stride | x.data.ptr | out.data.ptr) % u == 0)
    units = row_bytes // unit
    threads = _threads(units, 256)
    launch("elementwise", f"gather_rows_u{unit}", (rows.shape[0], min((units + threads - 1) // threads, 64)),
           threads, (x, np.int64(stride // unit), rows, out, np.int32(units)))
    return out


def embedding(table: cp.ndarray, ids) -> cp.ndarray:
    return gather_rows(table, ids)


def norm_suffix(x_dtype: np.dtype, w_dtype: np.dtype) -> str:
    """Kernel suffix of a norm over x with weights w: one dtype for both, or float32 weights beside
    bf16 activations (weights folded at load in fp32, like Qwen3.5's 1 + w)."""
    xs, ws = suffix(x_dtype), suffix(w_dtype)
    if xs == ws:
        return xs
    if (xs, ws) == ("bf16", "f32"):
        return "bf16_wf32"
    raise TypeError(f"norm weights of {np.dtype(w_dtype)} beside {np.dtype(x_dtype)} activations are not compiled")


def _in_words(n: int, strides: tuple[int, ...], *arrays: cp.ndarray) -> int:
    """Elements per 16-byte word if rows of n elements at these row strides can move as whole words
    (the kernels' `_v_` variants), else 1."""
    v = 16 // arrays[0].itemsize
    return v if n % v == 0 and all(s % v == 0 for s in strides) and all(a.data.ptr % 16 == 0 for a in arrays) else 1


def rms_norm(x: cp.ndarray, w: cp.ndarray, eps: float) -> cp.ndarray:
    x2, stride = rows2d(x)
    out = cp.empty(x.shape, dtype=x.dtype)
    n, sfx = x.shape[-1], norm_suffix(x.dtype, w.dtype)
    if x2.shape[0]:
        v = _in_words(n, (stride,), x2, w, out)
        launch("norm", f"rms_norm_{'v_' if v > 1 else ''}{sfx}", (x2.shape[0],), _threads(n // max(v, 4), 512),
               (x2, np.int64(stride), w, out, np.int32(n), np.float32(eps)))
    return out


def add_rms_norm(x: cp.ndarray, residual: cp.ndarray, w: cp.ndarray, eps: float) -> tuple[cp.ndarray, cp.ndarray]:
    """residual += x, in place (the fused kernel writes it back); returns (rms_norm(residual) * w, residual)."""
    x2, xs = rows2d(x)
    r2, rs = rows2d(residual)
    if r2.data.ptr != residual.data.ptr or r2.shape[0] != x2.shape[0]:
        raise ValueError("add_rms_norm updates residual in place: pass a [T, H] array with a unit last stride")
    out = cp.empty(x.shape, dtype=x.dtype)
    n, sfx = x.shape[-1], norm_suffix(x.dtype, w.dtype)
    if x2.shape[0]:
        v = _in_words(n, (xs, rs), x2, r2, w, out)
        launch("norm", f"add_rms_norm_{'v_' if v > 1 else ''}{sfx}", (x2.shape[0],), _threads(n // max(v, 4), 512),
               (x2, np.int64(xs), r2, np.int64(rs), w, out, np.int32(n), np.float32(eps)))
    return out, residual


ROPE_WORDS_MIN_HEADS = 2048   # below this many heads a step is latency-bound: a warp per head finishes sooner


def _rope_lanes(heads: int, d: int, half: int, strides: tuple[int, ...], *arrays: cp.ndarray | None) -> int:
    """Lanes per head of rope.cu's variants: 32 / (elements per 16-byte word) for the `_v_` one, for
    prefill-sized launches (at decode its fewer threads were slower on the H200) where heads
    (d % 32 == 0: its sum of squares keeps the scalar order) and rotation halves are whole words and
    every row stride and pointer allows them; else a warp (32, element by element). Both give the same bits."""
    if heads < ROPE_WORDS_MIN_HEADS:
        return 32
    v = _in_words(d, strides, *(a for a in arrays if a is not None))
    return 32 // v if v > 1 and d % 32 == 0 and half % v == 0 else 32


def _norm_rope(q, k, q_w, k_w, eps, positions, cos, sin) -> tuple[cp.ndarray, cp.ndarray]:
    q3, qs = heads3d(q)
    k3, ks = heads3d(k)
    (T, nh, d), nkv = q.shape, k.shape[1]
    cos = cp.ascontiguousarray(cos, dtype=cp.float32)  # tables are built float32; converting copies
    sin = cp.ascontiguousarray(sin, dtype=cp.float32)
    q_out = cp.empty(q.shape, dtype=q.dtype)
    k_out = cp.empty(k.shape, dtype=k.dtype)
    if q_w is not None and (q_w.dtype != k_w.dtype or not (q_w.flags.c_contiguous and k_w.flags.c_contiguous)):
        raise ValueError("qk_norm_rope: q and k norm weights must be contiguous and of one dtype")
    sfx = suffix(q.dtype) if q_w is None else norm_suffix(q.dtype, q_w.dtype)
    heads = T * (nh + nkv)
    if heads:
        lanes = _rope_lanes(heads, d, cos.shape[1], (qs, ks), q3, k3, q_out, k_out, q_w, k_w, cos, sin)
        launch("rope", f"qk_norm_rope_{'v_' if lanes < 32 else ''}{sfx}", (-(-heads * lanes // 128),), 128,
               (q3, np.int64(qs), k3, np.int64(ks), q_out, k_out,
                NULL if q_w is None else q_w, NULL if k_w is None else k_w, np.float32(eps),
                as_index(positions, np.int32), cos, sin, np.int32(cos.shape[1]),
                np.int32(T), np.int32(nh), np.int32(nkv), np.int32(d)))
    return q_out, k_out


def rope(q: cp.ndarray, k: cp.ndarray, positions, cos: cp.ndarray, sin: cp.ndarray) -> tuple[cp.ndarray, cp.ndarray]:
    return _norm_rope(q, k, None, None, 0.0, positions, cos, sin)


def qk_norm_rope(q: cp.ndarray, k: cp.ndarray, q_w: cp.ndarray, k_w: cp.ndarray, eps: float, positions,
                 cos: cp.ndarray, sin: cp.ndarray) -> tuple[cp.ndarray, cp.ndarray]:
    return _norm_rope(q, k, q_w, k_w, eps, positions, cos, sin)


def silu_mul(gate_up: cp.ndarray) -> cp.ndarray:
    g2, stride = rows2d(gate_up)
    inter = gate_up.shape[-1] // 2
    out = cp.empty((*gate_up.shape[:-1], inter), dtype=gate_up.dtype)
    if g2.shape[0] and inter:
        v = _in_words(inter, (stride,), g2, out)
        threads = _threads(inter // v, 256)
        launch("elementwise", f"silu_mul_{'v_' if v > 1 else ''}{suffix(gate_up.dtype)}",
               (g2.shape[0], min((inter // v + threads - 1) // threads, 64)), threads,
               (g2, np.int64(stride), out, np.int32(inter)))
    return out


def linear_silu_mul(x: cp.ndarray, w: cp.ndarray) -> cp.ndarray:
    """silu_mul(linear(x, w)) for w = [gate; up]: one GEMV with the SiLU in its epilogue where it applies
    (blas.gemv_silu_mul; the same bits), else the two ops."""
    out = gemv_silu_mul(x, w)
    return silu_mul(linear(x, w)) if out is None else out


def _check_caches(op: str, k_cache: cp.ndarray, v_cache: cp.ndarray) -> None:
    nb, bs, nkv, d = k_cache.shape
    it = k_cache.itemsize
    if k_cache.strides[1:] != (nkv * d * it, d * it, it) or v_cache.strides != k_cache.strides:
        raise ValueError(f"{op}: caches must be packed inside a block (strides {k_cache.strides}, "
                         f"{v_cache.strides}); only the block stride may differ")


def write_kv(k_cache: cp.ndarray, v_cache: cp.ndarray, k: cp.ndarray, v: cp.ndarray, slot_mapping) -> None:
    """Scatter k/v [T, nkv, d] into [num_blocks, block_size, nkv, d] caches; negative slots are skipped. fp8
    caches (uint8) store each value rounded to e4m3 (fp8.cuh)."""
    _check_caches("write_kv", k_cache, v_cache)
    nb, bs, nkv, d = k_cache.shape
    it = k_cache.itemsize
    k3, ks = heads3d(k)
    v3, vs = heads3d(v)
    T = k.shape[0]
    kv8 = k_cache.dtype == E4M3
    if T:
        launch("kv", f"write_kv_{'fp8_' if kv8 else ''}{suffix(k.dtype)}", (T,),
               _threads(nkv * d // 2 if kv8 else nkv * d, 256),
               (k_cache, v_cache, np.int64(k_cache.strides[0] // it), np.int32(bs), k3, np.int64(ks), v3,
                np.int64(vs), as_index(slot_mapping, np.int64), np.int32(nkv * d)))


def rope_write_kv(q: cp.ndarray, k: cp.ndarray, v: cp.ndarray, q_w: cp.ndarray | None, k_w: cp.ndarray | None,
                  eps: float, positions, cos: cp.ndarray, sin: cp.ndarray, k_cache: cp.ndarray, v_cache: cp.ndarray,
                  slot_mapping) -> cp.ndarray:
    """qk_norm_rope (rope when q_w is None) + write_kv in one launch: returns q; k and v land only in
    their cache slots (bitwise what the two ops store). Into fp8 caches it runs as those two ops."""
    _check_caches("rope_write_kv", k_cache, v_cache)
    if k_cache.dtype == E4M3:
        q, k = _norm_rope(q, k, q_w, k_w, eps, positions, cos, sin)
        write_kv(k_cache, v_cache, k, v, slot_mapping)
        return q
    if any(w is not None and w.dtype != q.dtype for w in (q_w, k_w)):
        raise TypeError("rope_write_kv takes norm weights of the activation dtype; use qk_norm_rope + write_kv")
    nb, bs, nkv, d = k_cache.shape
    it = k_cache.itemsize
    q3, qs = heads3d(q)
    k3, ks = heads3d(k)
    v3, vs = heads3d(v)
    T, nh = q.shape[:2]
    cos = cp.ascontiguousarray(cos, dtype=cp.float32)
    sin = cp.ascontiguousarray(sin, dtype=cp.float32)
    q_out = cp.empty(q.shape, dtype=q.dtype)
    heads = T * (nh + 2 * nkv)
    if heads:
        lanes = _rope_lanes(heads, d, cos.shape[1], (qs, ks, vs, k_cache.strides[0] // it), q3, k3, v3, q_out, k_cache,
                            v_cache, q_w, k_w, cos, sin)
        launch("rope", f"rope_write_kv_{'v_' if lanes < 32 else ''}{suffix(q.dtype)}", (-(-heads * lanes // 128),), 128,
               (q3, np.int64(qs), k3, np.int64(ks), v3, np.int64(vs), q_out, k_cache, v_cache,
                np.int64(k_cache.strides[0] // it), np.int32(bs), as_index(slot_mapping, np.int64),
                NULL if q_w is None else q_w, NULL if k_w is None else k_w, np.float32(eps),
                as_index(positions, np.int32), cos, sin, np.int32(cos.shape[1]),
                np.int32(T), np.int32(nh), np.int32(nkv), np.int32(d)))
    return q_out


SAMPLE_CHUNK = 4096  # logits per block in the first sampling stage (152k vocab -> 38 blocks a row)


def argmax(logits: cp.ndarray) -> cp.ndarray:
    """Greedy token per row of [S, vocab] logits -> int32 [S] (ties: the lowest index)."""
    x, stride = rows2d(logits)
    S, n = x.shape
    out = cp.empty((S,), dtype=cp.int32)
    if S:
        chunks = -(-n // SAMPLE_CHUNK)
        cv, ci = cp.empty((S, chunks), cp.float32), cp.empty((S, chunks), cp.int32)
        launch("sampling", f"argmax_chunks_{suffix(x.dtype)}", (chunks, S), 256,
               (x, np.int64(stride), np.int32(n), np.int32(SAMPLE_CHUNK), cv, ci))
        launch("sampling", "argmax_merge", (S,), 64, (cv, ci, np.int32(chunks), out))
    return out


def top_logprobs(logits: cp.ndarray, k: int) -> tuple[cp.ndarray, cp.ndarray]:
    """log_softmax then top-k per row: (float32 values [S, k], int32 indices [S, k]), best first."""
    x, stride = rows2d(logits)
    S, n = x.shape
    if not 0 < k <= n:
        raise ValueError(f"top_logprobs: k={k} must be in 1..{n}")
    values = cp.empty((S, k), dtype=cp.float32)
    indices = cp.empty((S, k), dtype=cp.int32)
    if S:
        chunks = -(-n // SAMPLE_CHUNK)
        cm, cs = cp.empty((S, chunks), cp.float32), cp.empty((S, chunks), cp.float32)
        cv, ci = cp.empty((S, chunks, k), cp.float32), cp.empty((S, chunks, k), cp.int32)
        launch("sampling", f"top_logprobs_chunks_{suffix(x.dtype)}", (chunks, S), 256,
               (x, np.int64(stride), np.int32(n), np.int32(SAMPLE_CHUNK), np.int32(k), cm, cs, cv, ci))
        launch("sampling", "top_logprobs_merge", (S,), 256,
               (cm, cs, cv, ci, np.int32(chunks), np.int32(k), values, indices))
    return values, indices


def score_rows(logits: cp.ndarray, targets: cp.ndarray, k: int
               ) -> tuple[cp.ndarray, cp.ndarray, cp.ndarray, cp.ndarray]:
    """Each row's target token scored (sampling.score_rows is the reference): (float32 logprob [R], int32
    rank [R], top-k float32 logprobs [R, max(k, 1)] and int32 ids, best first)."""
    x, stride = rows2d(logits)
    R, n = x.shape
    kk = max(k, 1)   # the top-1 gives the log-sum-exp
    values, ids = top_logprobs(x, kk)
    logprob, rank = cp.empty((R,), cp.float32), cp.empty((R,), cp.int32)
    if R:
        launch("sampling", f"score_rows_{suffix(x.dtype)}", (R,), 256,
               (x, np.int64(stride), np.int32(n), as_index(targets, np.int32), values, ids, np.int32(kk),
                logprob, rank))
    return logprob, rank, values, ids
