"""CPU emulation of gemv.cu's indexing (no GPU): each lane's 16-byte loads of w and x, the two
mma.sync m16n8k16 a chunk feeds (fragment layouts as in test_attention_mma_emulation), the warps'
reduction, split-K partials summed in split order, and store_tile; compared with x @ w.T.
Mirrors gemv_tile line by line: change both together."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.kernels.cuda.blas import GEMV_MIN_SPLIT_K, gemv_splits
from test_attention_mma_emulation import LANE, mma

WARPS = 4
G, Q = LANE >> 2, LANE & 3


def _chunk(mat, row, c):
    """[32, 4, 2]: the lane's 16-byte chunk c (8 values) of `row` as four bf16x2 words."""
    return mat[row[:, None], c[:, None] * 8 + np.arange(8)].reshape(32, 4, 2)


def emulate(x, w, splits, U=4):
    """y [M, N] as gemv_bf16_u{U} computes it with grid (ceil(N / 16), splits)."""
    M, K = x.shape
    N, chunks = w.shape[0], K // 8
    tiles = -(-N // 16)
    y = np.full((M, N), np.nan)
    partial = np.zeros((splits, tiles, 32, 4))
    for tile in range(tiles):
        for split in range(splits):
            s_lo, s_hi = chunks * split // splits, chunks * (split + 1) // splits
            n0 = tile * 16
            wa, wb, xr = np.minimum(n0 + G, N - 1), np.minimum(n0 + G + 8, N - 1), np.minimum(G, M - 1)
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
                _store(y, s, n0)
            else:
                partial[split, tile] = s
        if splits > 1:
            _store(y, partial[:, tile].sum(axis=0), tile * 16)
    return y


def _store(y, s, n0):
    M, N = y.shape
    for ln in range(32):
        for e, (m, r) in enumerate(((2 * Q[ln], n0 + G[ln]), (2 * Q[ln] + 1, n0 + G[ln]),
                                    (2 * Q[ln], n0 + G[ln] + 8), (2 * Q[ln] + 1, n0 + G[ln] + 8))):
            if r < N and m < M:
                y[m, r] = s[ln, e]


@pytest.mark.parametrize("M,N,K,splits", [(1, 16, 256, 1), (3, 40, 520, 1), (8, 33, 1024, 3), (5, 7, 4104, 4),
                                          (2, 64, 64, 1)])
def test_gemv_indexing_matches_matmul(M, N, K, splits):
    rng = np.random.default_rng(M * N + K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    y = emulate(x, w, splits)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T, rtol=1e-9, atol=1e-9)


def test_gemv_splits_stay_in_one_wave():
    assert gemv_splits(151936, 4096, 528) == 1                  # the LM head fills the GPU alone
    assert gemv_splits(512, 4096, 528) == 4096 // GEMV_MIN_SPLIT_K   # capped by depth
    for n, k in ((128, 4096), (1024, 12288), (4096, 1024)):
        s = gemv_splits(n, k, 528)
        assert 1 <= s <= 16 and s * -(-n // 16) <= max(528, -(-n // 16)) and (s == 1 or k // s >= GEMV_MIN_SPLIT_K)
