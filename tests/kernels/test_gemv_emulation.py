"""CPU emulation of gemv.cu's indexing (no GPU): each lane's 16-byte loads of w and x, the two
mma.sync m16n8k16 a chunk feeds (fragment layouts as in test_attention_mma_emulation), the warps'
reduction, split-K partials summed in split order, and the epilogues' row choice and stores (StoreY,
SiluMul); compared with x @ w.T and silu_mul of it. Mirrors gemv_tile line by line: change both together."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.kernels import numpy_ops as ref
from openinfer.kernels.cuda.blas import GEMV_MIN_SPLIT_K, gemv_splits
from test_attention_mma_emulation import LANE, mma

WARPS = 4
G, Q = LANE >> 2, LANE & 3


def _chunk(mat, row, c):
    """[32, 4, 2]: the lane's 16-byte chunk c (8 values) of `row` as four bf16x2 words."""
    return mat[row[:, None], c[:, None] * 8 + np.arange(8)].reshape(32, 4, 2)


def store_y_rows(N):
    """StoreY::row: tile t = rows 16t .. 16t + 15, rows past N repeat N - 1."""
    return lambda tile, r: np.minimum(tile * 16 + r, N - 1)


def silu_rows(inter):
    """SiluMul::row: gate rows 8t .. 8t + 7 as rows 0..7, the matching up rows as 8..15."""
    return lambda tile, r: np.where(r < 8, tile * 8 + r, inter + tile * 8 + r - 8)


def emulate(x, w, splits, tiles, row, U=4):
    """[tiles, 32 lanes, 4]: the final sums s each tile hands its epilogue, as gemv_tile computes them with
    grid (tiles, splits) and the epilogue's row(tile, r)."""
    M, K = x.shape
    chunks = K // 8
    final = np.zeros((tiles, 32, 4))
    partial = np.zeros((splits, tiles, 32, 4))
    for tile in range(tiles):
        for split in range(splits):
            s_lo, s_hi = chunks * split // splits, chunks * (split + 1) // splits
            wa, wb, xr = row(tile, G), row(tile, G + 8), np.minimum(G, M - 1)
            red = np.zeros((WARPS, 32, 4))
            for warp in range(WARPS):
                lo = s_lo + (s_hi - s_lo) * warp // WARPS
                hi = s_lo + (s_hi - s_lo) * (warp + 1) // WARPS
                acc = np.zeros((32, 4))
                base = lo
                while base < hi:   # the full iterations, then the predicated tail
                    for u in range(U):
                        c = base + 4 * u + Q
                        ok = c < hi
                        cc = np.where(ok, c, lo)
                        a, b, xv = (_chunk(w, wa, cc), _chunk(w, wb, cc), _chunk(x, xr, cc))
                        a[~ok] = b[~ok] = xv[~ok] = 0
                        for h in range(2):   # k-step h: words (a[2h], b[2h], a[2h+1], b[2h+1] | x[2h], x[2h+1])
                            frag = np.stack([a[:, 2 * h], b[:, 2 * h], a[:, 2 * h + 1], b[:, 2 * h + 1]], axis=1)
                            mma(acc, frag, xv[:, 2 * h], xv[:, 2 * h + 1])
                    base += 4 * U
                red[warp] = acc
            s = red[0] + red[1] + red[2] + red[3]
            if splits == 1:
                final[tile] = s
            else:
                partial[split, tile] = s
        if splits > 1:   # the cluster reduction: rank 0 sums the splits in split order
            final[tile] = partial[:, tile].sum(axis=0)
    return final


def store_y(final, M, N):
    """StoreY::store: y[M, N] (NaN where nothing was stored)."""
    y = np.full((M, N), np.nan)
    for tile, s in enumerate(final):
        for ln in range(32):
            for e, (m, r) in enumerate(((2 * Q[ln], tile * 16 + G[ln]), (2 * Q[ln] + 1, tile * 16 + G[ln]),
                                        (2 * Q[ln], tile * 16 + G[ln] + 8), (2 * Q[ln] + 1, tile * 16 + G[ln] + 8))):
                if r < N and m < M:
                    y[m, r] = s[ln, e]
    return y


def store_silu(final, M, inter):
    """SiluMul::store: out[m, 8t + g] from (s.x, s.z) for m = 2q and (s.y, s.w) for m = 2q + 1."""
    out = np.full((M, inter), np.nan)
    for tile, s in enumerate(final):
        for ln in range(32):
            j = tile * 8 + G[ln]
            for m, (gate, up) in ((2 * Q[ln], (s[ln, 0], s[ln, 2])), (2 * Q[ln] + 1, (s[ln, 1], s[ln, 3]))):
                if m < M:
                    assert np.isnan(out[m, j]), "two lanes store one element"
                    out[m, j] = gate / (1.0 + np.exp(-gate)) * up
    return out


@pytest.mark.parametrize("M,N,K,splits", [(1, 16, 256, 1), (3, 40, 520, 1), (8, 33, 1024, 3), (5, 7, 4104, 4),
                                          (2, 64, 64, 1)])
def test_gemv_indexing_matches_matmul(M, N, K, splits):
    rng = np.random.default_rng(M * N + K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    y = store_y(emulate(x, w, splits, -(-N // 16), store_y_rows(N)), M, N)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("M,inter,K,splits", [(1, 8, 256, 1), (3, 40, 520, 1), (8, 24, 1024, 3), (5, 16, 4104, 4)])
def test_gemv_silu_rows_pair_gate_with_up(M, inter, K, splits):
    """Tile t = gate rows 8t.. and up rows inter + 8t..: every output element of silu_mul(x @ w.T) is
    stored once, by the lane holding its gate and up sums."""
    rng = np.random.default_rng(M * inter + K)
    x = rng.standard_normal((M, K))
    w = rng.standard_normal((2 * inter, K)) / np.sqrt(K)
    out = store_silu(emulate(x, w, splits, inter // 8, silu_rows(inter)), M, inter)
    np.testing.assert_allclose(out, ref.silu_mul(x @ w.T), rtol=1e-9, atol=1e-12)


def test_gemv_splits_stay_in_one_wave():
    assert gemv_splits(151936, 4096, 528) == 1                  # the LM head fills the GPU alone
    assert gemv_splits(512, 4096, 528) == 4096 // GEMV_MIN_SPLIT_K   # capped by depth
    for n, k in ((128, 4096), (1024, 12288), (4096, 1024)):
        s = gemv_splits(n, k, 528)
        assert 1 <= s <= 16 and s * -(-n // 16) <= max(528, -(-n // 16)) and (s == 1 or k // s >= GEMV_MIN_SPLIT_K)
