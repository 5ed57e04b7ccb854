"""rope_write_kv (QK-norm + RoPE + paged KV store, one launch per layer) in 16-byte words against the
warp-per-head kernel, Qwen3-4B shapes, decode and prefill (GPU only).

    python scripts/rope_bench.py

Times are CUDA-graph replays; GB/s counts q/k/v read, q and the k/v cache rows written.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from gemv_bench import FLOOR_BW, bf, graph_us, rand
from openinfer.kernels.cuda import ops

NH, NKV, D, MAX_POS, BS = 32, 8, 128, 32768, 16
PARTS = ((0, NH), (NH, NH + NKV), (NH + NKV, NH + 2 * NKV))   # q, k, v heads of a fused qkv row


def main() -> None:
    half = D // 2
    ang = np.arange(MAX_POS)[:, None] * (1e6 ** (-np.arange(half) / half))[None]
    cos, sin = cp.asarray(np.cos(ang), cp.float32), cp.asarray(np.sin(ang), cp.float32)
    qw, kw = rand(D), rand(D)
    print(f"{'rope_write_kv T':<18} {'words us':>9} {'GB/s':>6} {'scalar us':>10} {'GB/s':>6} {'floor us':>9}")
    for T in (1, 8, 512, 16384):
        qkv = rand(T, (NH + 2 * NKV) * D)
        q, k, v = (qkv[:, a * D: b * D].reshape(T, -1, D) for a, b in PARTS)
        blocks = -(-T // BS)
        k_cache, v_cache = (cp.zeros((blocks, BS, NKV, D), bf) for _ in range(2))
        pos = cp.arange(T, dtype=cp.int32)
        slots = cp.arange(T, dtype=cp.int64)
        nbytes = 2 * qkv.nbytes + 2 * 2 * T * NKV * D   # qkv read, q written, k and v cache rows written

        def fn():
            ops.rope_write_kv(q, k, v, qw, kw, 1e-6, pos, cos, sin, k_cache, v_cache, slots)
        threshold, ops.ROPE_WORDS_MIN_HEADS = ops.ROPE_WORDS_MIN_HEADS, 0   # words at every size
        try:
            words = graph_us(fn, reps=20, inner=4)
        finally:
            ops.ROPE_WORDS_MIN_HEADS = threshold
        real = ops._rope_lanes
        ops._rope_lanes = lambda *a: 32   # the warp-per-head kernel
        try:
            scalar = graph_us(fn, reps=20, inner=4)
        finally:
            ops._rope_lanes = real
        print(f"{T:<18} {words:9.1f} {nbytes / words / 1e3:6.0f} {scalar:10.1f} {nbytes / scalar / 1e3:6.0f} "
              f"{nbytes / FLOOR_BW * 1e6:9.1f}")


if __name__ == "__main__":
    main()
