"""CPU emulation of skinny_gemm.cu (no GPU): the producer's TMA box copies into the 128-byte-swizzled stages
(the swizzle applied to the absolute shared address, rows and k outside the matrix arriving as zeros), the
consumers' wgmma descriptors read through test_attention_wgmma_emulation's model of the hardware, the m64nN
accumulator layout, the staged partial tile and the split-K reduction in rank order; compared with x @ w.T.
Shared memory starts as NaN, so a descriptor reading a byte no copy wrote poisons the output. Mirrors
skinny_gemm() line by line: change both together."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.kernels.cuda import skinny_gemm as sg
from test_attention_wgmma_emulation import _swizzle, acc_rc, desc_sw128, kmajor_operand

BN, BK, ROW, THREADS, PAD = sg.SG_BN, sg.SG_BK, sg.SG_ROW, sg.SG_THREADS, 4


def tma_box(smem, dst, mat, c0, c1, box_rows):
    """tma_load_2d: box [box_rows][64] of bf16 `mat` at (column c0, row c1) to byte `dst` (1024-byte aligned),
    zeros outside the matrix, each element at its swizzled address."""
    rows, cols = mat.shape
    r, k = np.arange(box_rows)[:, None], np.arange(BK)[None, :]
    inside = (c1 + r < rows) & (c0 + k < cols)
    vals = np.where(inside, mat[np.minimum(c1 + r, rows - 1), np.minimum(c0 + k, cols - 1)], 0.0)
    smem[_swizzle(dst + r * ROW + k * 2) // 2] = vals


def cta_partial(x, w, mp, tile, split, splits, silu=False, per_sm=1):
    """One CTA's staged partial tile part[mp][LD] (fp32 values), as its producer and consumers build it (silu: w is
    [gate; up], the stage's rows 0..63 gate rows from 64 tile, 64..127 the matching up rows)."""
    K = x.shape[1]
    stage_bytes, stages = BN * ROW + mp * ROW, sg.stages(mp, per_sm)
    ktiles = -(-K // BK)
    k0 = ktiles * split // splits
    iters = ktiles * (split + 1) // splits - k0
    smem = np.full(stages * stage_bytes // 2, np.nan)   # element-indexed, base 1024-byte aligned
    d = np.zeros((2, 128, mp // 2))                      # consumer warpgroups 1, 2: [thread][register]
    rows, cols = acc_rc(mp)
    for i in range(iters):
        s = i % stages
        if silu:
            tma_box(smem, s * stage_bytes, w, (k0 + i) * BK, tile * 64, 64)
            tma_box(smem, s * stage_bytes + 64 * ROW, w, (k0 + i) * BK, w.shape[0] // 2 + tile * 64, 64)
        else:
            tma_box(smem, s * stage_bytes, w, (k0 + i) * BK, tile * BN, BN)
        tma_box(smem, s * stage_bytes + BN * ROW, x, (k0 + i) * BK, 0, mp)
        for g in range(2):
            wa, xa = s * stage_bytes + g * 64 * ROW, s * stage_bytes + BN * ROW
            for kk in range(BK // 16):
                A = kmajor_operand(smem, desc_sw128(wa + kk * 32, 16, 1024), 64)    # [64][16] weight rows
                B = kmajor_operand(smem, desc_sw128(xa + kk * 32, 16, 1024), mp)    # [mp][16] batch rows
                d[g] += (A @ B.T)[rows, cols]
    ld = BN + PAD
    part = np.full(mp * ld, np.nan)
    t = np.arange(128)
    warp, lane = t >> 5, t & 31
    for g in range(2):
        r, m0 = g * 64 + warp * 16 + (lane >> 2), 2 * (lane & 3)
        for j in range(mp // 8):
            base = (8 * j + m0) * ld + r
            part[base] = d[g][:, 4 * j]
            part[base + ld] = d[g][:, 4 * j + 1]
            part[base + 8] = d[g][:, 4 * j + 2]
            part[base + ld + 8] = d[g][:, 4 * j + 3]
    return part


def emulate(x, w, splits, silu=False, per_sm=1):
    """y [M][N] as the grid (tiles, splits) of skinny_gemm_bf16_n<width(M)> stores it (before the bf16 rounding);
    silu: skinny_gemm_silu_bf16_n<width(M)>'s [M][N / 2] with silu_mul on bf16-rounded gate and up."""
    M = x.shape[0]
    N = w.shape[0] // 2 if silu else w.shape[0]
    mp, ld, cols = sg.width(M), BN + PAD, 64 if silu else BN
    y = np.full((M, N), np.nan)
    row_chunks = cols // 4
    chunks = mp * row_chunks
    for tile in range(-(-N // cols)):
        parts = [cta_partial(x, w, mp, tile, s, splits, silu, per_sm) for s in range(splits)]
        for split in range(splits):
            lo, hi = chunks * split // splits, chunks * (split + 1) // splits
            for c in range(lo, hi):
                m, nl = c // row_chunks, (c % row_chunks) * 4
                n = tile * cols + nl
                if m >= M or n >= N:
                    continue
                acc = sum(p[m * ld + nl: m * ld + nl + 4] for p in parts)   # rank order
                if silu:
                    up = sum(p[m * ld + 64 + nl: m * ld + 64 + nl + 4] for p in parts)
                    acc = silu_mul(bf16_round(acc), bf16_round(up))
                e = min(4, N - n)
                y[m, n: n + e] = acc[:e]
    return y


def bf16_round(v):
    import ml_dtypes
    return np.asarray(v, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def silu_mul(gate, up):
    return gate / (1 + np.exp(-gate)) * up


def bf16_values(rng, *shape):
    import ml_dtypes
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("M,N,K,splits", [
    (1, 256, 192, 2),       # batch 1 on the width-8 variant, split
    (5, 100, 64, 1),        # width 8, a partial tile
    (9, 128, 64, 1),        # one tile, one stage, the smallest batch of width 16
    (16, 200, 200, 1),      # N past the last full tile, K past the last full stage
    (32, 256, 640, 3),      # split-K in a cluster of 3, ten stages over fewer stage buffers
    (40, 130, 192, 2),      # batch padded to 64, a two-row last tile
    (128, 128, 576, 4),     # the widest variant, more stages than buffers per split
    (100, 64, 128, 2),      # fewer weight rows than a tile
])
def test_skinny_gemm_emulation_matches_matmul(M, N, K, splits):
    rng = np.random.default_rng(M * 1000 + N + K)
    x, w = bf16_values(rng, M, K), bf16_values(rng, N, K)
    for per_sm in sg.variants(sg.width(M)):   # the _x2 kernels: fewer stages, so the ring wraps sooner
        np.testing.assert_allclose(emulate(x, w, splits, per_sm=per_sm), x @ w.T, rtol=1e-9, atol=1e-9)


def test_stages_fit_shared_memory_and_the_partial_tile():
    for mp in sg.WIDTHS:
        for per_sm in sg.variants(mp):
            assert per_sm * sg.smem_bytes(mp, per_sm) <= 226 * 1024   # 228 KB an SM, 1 KB reserved a CTA
            assert mp * (BN + PAD) * 4 <= sg.stages(mp, per_sm) * (BN * ROW + mp * ROW)
            assert sg.stages(mp, per_sm) >= 4


def test_default_splits_fill_one_wave():
    # Qwen3-4B decode weights on 132 SMs: o / down (N 2560) split 6 ways, qkv twice, gate_up and lm_head not at all
    assert [sg.default_splits(n, k, 132) for n, k in
            [(2560, 4096), (2560, 9728), (6144, 2560), (19456, 2560), (151936, 2560)]] == [6, 6, 2, 1, 1]
    assert sg.default_splits(128, 128, 132) == 1      # too shallow to split
    # clusters share a GPC: where only 16 clusters of 6 fit at once, o's 20 tiles take 5 splits
    assert sg.default_splits(2560, 4096, 132, lambda s: {6: 16, 5: 24}[s]) == 5
    assert sg.default_splits(2560, 4096, 132, lambda s: 4) == 1
    assert [sg.width(m) for m in (1, 8, 9, 16, 17, 32, 33, 64, 65, 128)] == [8, 8, 16, 16, 32, 32, 64, 64, 128, 128]


@pytest.mark.parametrize("M,inter,K,splits", [
    (1, 64, 128, 2),        # batch 1: width 8, split
    (9, 64, 64, 1),         # one tile of 64 gate + 64 up rows
    (32, 200, 192, 3),      # a partial last tile whose gate box runs into up rows (not stored)
    (128, 128, 320, 2),     # the widest variant
])
def test_silu_epilogue_matches_silu_mul_of_the_product(M, inter, K, splits):
    rng = np.random.default_rng(M + inter + K)
    x, w = bf16_values(rng, M, K), bf16_values(rng, 2 * inter, K)
    y = emulate(x, w, splits, silu=True)
    h = emulate(x, w, splits)            # the plain kernel's sums: the same bits before the epilogue
    np.testing.assert_array_equal(y, silu_mul(bf16_round(h[:, :inter]), bf16_round(h[:, inter:])))
    want = x @ w.T
    np.testing.assert_allclose(y, silu_mul(bf16_round(want[:, :inter]), bf16_round(want[:, inter:])), rtol=1e-6, atol=1e-9)
