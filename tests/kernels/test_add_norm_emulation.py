"""CPU emulation of the fused add + RMSNorm GEMV's sum of squares (no GPU): add_rms_norm_v_*'s order
(norm.cu: thread t of a B-thread block adds the squares of words t, t + B, ... element by element,
warp_sum's butterfly per warp, then one warp_sum over the B / 32 warp sums padded with zeros) against
gemv.cu's add_norm_prologue (4 warps playing those B / 32 "virtual warps" of every row, G at a time).
Equal bits here mean the two perform the same float32 operations in the same order, which is what
makes add_rms_norm_linear bit-identical to add_rms_norm + linear. Each step is rounded as the GPU
rounds it (ss += r * r is one fma). Mirrors both device functions line by line: change them together."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cupy")
from openinfer.kernels.cuda.ops import _norm_threads  # noqa: E402  (the block size add_rms_norm launches)

WARPS, G, MAX_M = 4, 4, 8   # gemv.cu: warps per CTA, items per round, rows


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (nearest even) and back, as from_f32<bf16> does."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def _fma_sq(r: np.ndarray, ss: np.ndarray) -> np.ndarray:
    """ss + r * r with one rounding (fmaf): the square of a bf16 value is exact in float64."""
    return (np.float64(1) * ss + np.float64(1) * r * r).astype(np.float32)


def _warp_sum(v: np.ndarray) -> np.float32:
    """common.cuh warp_sum over 32 lanes: each lane adds its xor partner's value, o = 16, 8, .., 1."""
    v = v.astype(np.float32)
    o = 16
    while o:
        v = (v + v[np.arange(32) ^ o]).astype(np.float32)
        o >>= 1
    assert len({x.tobytes() for x in v}) == 1   # all lanes agree
    return v[0]


def _inv(total: np.float32, n: int, eps: float) -> np.float32:
    """1.f / sqrtf(total / n + eps), each step correctly rounded (NVRTC's default prec-div/prec-sqrt)."""
    return np.float32(1) / np.sqrt(np.float32(total) / np.float32(n) + np.float32(eps))


def norm_kernel_inv(x: np.ndarray, res: np.ndarray, eps: float, threads: int) -> np.ndarray:
    """inv_rms per row as add_rms_norm_row<8> (norm.cu) with `threads` threads computes it."""
    return np.array([_inv(s, x.shape[1], eps) for s in norm_kernel_sums(x, res, threads)], np.float32)


def norm_kernel_sums(x: np.ndarray, res: np.ndarray, threads: int) -> np.ndarray:
    """block_sum(ss) per row of add_rms_norm_row<8> (norm.cu) with `threads` threads."""
    M, K = x.shape
    words = K // 8
    out = np.empty(M, np.float32)
    for m in range(M):
        r = _bf16(x[m] + res[m]).reshape(words, 8)
        ss = np.zeros(threads, np.float32)
        for i in range(0, words, threads):      # for (i = t * V; i < n; i += blockDim.x * V)
            t = np.arange(threads)
            live = t + i < words
            for e in range(8):
                ss[live] = _fma_sq(r[(t + i)[live], e], ss[live])
        partial = [_warp_sum(ss[w * 32:(w + 1) * 32]) for w in range(threads // 32)]
        out[m] = _warp_sum(np.array(partial + [0.0] * (32 - len(partial)), np.float32))
    return out


def prologue_inv(x: np.ndarray, res: np.ndarray, eps: float, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """(inv_rms per row, the residual CTA (0, 0) stores) as gemv.cu's add_norm_prologue computes them."""
    M, chunks = x.shape[0], x.shape[1] // 8
    lane = np.arange(32)
    vwarps = threads >> 5
    items = M * vwarps
    part = np.full((MAX_M, 32), np.nan, np.float32)
    res_out = np.full(x.shape, np.nan, np.float32)
    for warp in range(WARPS):
        for base in range(warp, items, WARPS * G):
            ok = [base + WARPS * j < items for j in range(G)]
            it = [base + WARPS * j if ok[j] else base for j in range(G)]
            m, vw = [i // vwarps for i in it], [i % vwarps for i in it]
            ss = [np.zeros(32, np.float32) for _ in range(G)]
            for i in range(0, chunks, threads):
                for j in range(G):
                    c = vw[j] * 32 + lane + i
                    live = c < chunks
                    words = c[live, None] * 8 + np.arange(8)
                    r = _bf16(x[m[j], words] + res[m[j], words])   # add_word
                    for e in range(8):
                        ss[j][live] = _fma_sq(r[:, e], ss[j][live])
                    if ok[j]:
                        assert np.isnan(res_out[m[j], words]).all()   # each word stored once
                        res_out[m[j], words] = r
            for j in range(G):
                v = _warp_sum(ss[j])
                if ok[j]:
                    part[m[j], vw[j]] = v
    inv = np.empty(M, np.float32)
    for r in range(M):   # warp r % WARPS
        inv[r] = _inv(_warp_sum(np.where(lane < vwarps, part[r], 0).astype(np.float32)), chunks * 8, eps)
    return inv, res_out


@pytest.mark.parametrize("K", [8, 1000, 2560, 4096, 5000, 9728])   # 1 word; B = 128, 320, 512; 2-3 words/thread
@pytest.mark.parametrize("M", [1, 3, 8])
def test_prologue_keeps_add_rms_norm_order(M, K):
    rng = np.random.default_rng(M * 10000 + K)
    threads = _norm_threads(K, 8)
    assert threads % 32 == 0 and threads <= 1024
    wide = lambda: _bf16(rng.standard_normal((M, K)) * np.exp(rng.standard_normal((M, K)) * 3))  # noqa: E731
    x, res = wide(), wide()
    inv, res_out = prologue_inv(x, res, 1e-6, threads)
    assert inv.tobytes() == norm_kernel_inv(x, res, 1e-6, threads).tobytes()
    np.testing.assert_array_equal(res_out, _bf16(x + res))   # every word, as add_rms_norm stores it
    want = 1 / np.sqrt(np.mean(np.square(_bf16(x + res), dtype=np.float64), axis=-1) + 1e-6)
    np.testing.assert_allclose(inv, want, rtol=1e-5)


def test_other_orders_give_other_bits():
    """The comparison can fail: summing the same squares in another order (a 32-thread block) changes
    the bits of the sums for data of a wide range."""
    rng = np.random.default_rng(1)
    x = _bf16(rng.standard_normal((8, 2560)) * np.exp(rng.standard_normal((8, 2560)) * 3))
    res = np.zeros_like(x)
    assert (norm_kernel_sums(x, res, 320) != norm_kernel_sums(x, res, 32)).any()
