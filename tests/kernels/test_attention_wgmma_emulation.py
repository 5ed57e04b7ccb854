"""CPU emulation of attention_wgmma.cu (no GPU): the kernel's shared-memory addressing (128-byte swizzle),
its wgmma matrix descriptors and its per-thread fragment code, run thread by thread over numpy "shared
memory", with the hardware side modelled from the PTX ISA: a descriptor's operand read (canonical
K-major / MN-major 128-byte-swizzle layouts, the XOR of address bits 4-6 with bits 7-9), the m64nN
accumulator and the register-A fragment layouts. Shared memory starts as NaN, so a descriptor that reads
a byte no copy wrote poisons the output. Mirrors the kernel line by line: change both together."""
from __future__ import annotations

import math

import numpy as np
import pytest

from test_attention_mma_emulation import bf, prefill_case


def f16(x):
    """Round to f16 (nearest even) and back: pack_f16x2, bf16x2_to_f16x2."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)

D, BM, THREADS, SW_ROW = 128, 128, 256, 128
TID = np.arange(THREADS)
LANE, WARP, WG = TID & 31, (TID >> 5) & 3, TID >> 7


def sw128_offset(r, c, R):
    """Byte offset of elements (r, c .. c + 7) of a [R][128] tile kept as two swizzled [R][64] halves."""
    return (c >> 6) * R * SW_ROW + r * SW_ROW + ((((c >> 3) & 7) ^ (r & 7)) << 4)


def desc_sw128(addr, lbo, sbo):
    """wgmma_desc_sw128 (wgmma.cuh)."""
    return ((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32) | (1 << 62)


def _fields(desc):
    """The PTX descriptor fields: start, leading and stride byte offsets (bytes); 128 B swizzle, base 0."""
    assert desc >> 62 == 1 and (desc >> 49) & 7 == 0, "expected a 128-byte swizzle descriptor, base offset 0"
    return (desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4


def _swizzle(addr):
    return addr ^ (((addr >> 7) & 7) << 4)


def kmajor_operand(smem, desc, rows):
    """[rows][16] read by a K-major descriptor: rows 8 apart by SBO, 128 B within 8, 2 chunks of 8 k."""
    start, _, sbo = _fields(desc)
    i, k = np.arange(rows)[:, None], np.arange(16)[None, :]
    addr = start + (i // 8) * sbo + (i % 8) * SW_ROW + (k // 8) * 16 + (k % 8) * 2
    return smem[_swizzle(addr) // 2]


def mnmajor_operand(smem, desc, n):
    """[16][n] read by an MN-major descriptor: 64 n a 128-byte row, k rows 128 B apart, 8 k apart by SBO,
    64 n apart by LBO."""
    start, lbo, sbo = _fields(desc)
    k, j = np.arange(16)[:, None], np.arange(n)[None, :]
    addr = start + (j % 64) * 2 + (j // 64) * lbo + (k % 8) * SW_ROW + (k // 8) * sbo
    return smem[_swizzle(addr) // 2]


def acc_rc(n):
    """(row, col) of accumulator register i of each of a warpgroup's 128 threads, m64nN: [128][n / 2]."""
    t, i = np.arange(128)[:, None], np.arange(n // 2)[None, :]
    return 16 * (t >> 5) + ((t & 31) >> 2) + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (t & 3) + (i & 1)


def areg_matrix(pa):
    """A [64][16] from the register fragments pa[128 threads][4 regs][2 halves] (mma.sync m16n8k16 A per warp)."""
    A = np.full((64, 16), np.nan)
    t = np.arange(128)
    for r in range(4):
        for h in range(2):
            A[16 * (t >> 5) + ((t & 31) >> 2) + 8 * (r & 1), 2 * (t & 3) + h + 8 * (r >> 1)] = pa[:, r, h]
    return A


def cp_async16(smem, dst, src, flat, valid):
    """Every thread's 16-byte copy at once: element offsets dst, src [threads]; zeros where not valid."""
    e = np.arange(8)
    smem[dst[:, None] + e] = np.where(valid[:, None], flat[np.where(valid, src, 0)[:, None] + e], 0)


def load_kv_tile(smem, ks, vs, kflat, vflat, offset, kend, k0, BN, kv8=False):
    """load_kv_tile_sw<BN, E>: every thread's cp.async chunks (row, 16-byte column) of every pass. bf16 (16 chunks
    a row) into the swizzled tile of the element-indexed smem; e4m3 (8 chunks, `kv8`) into a byte-indexed stage
    as stored. Returns each pass's stage offsets of the threads' chunks [passes][THREADS]."""
    ch = 8 if kv8 else 16
    rw, passes, owned = 32 // ch, BN * ch // THREADS, []
    key = k0 + (LANE // rw) * 8 * rw + rw * (TID >> 5) + LANE % rw
    off = np.array([offset(k) if ln < rw * passes and k < kend else -1 for k, ln in zip(key, LANE)])
    for p in range(passes):
        o = off[(TID & ~31) + rw * p + LANE // ch]   # __shfl_sync(off, RW p + lane / CH)
        r, c = p * 8 * rw + rw * (TID >> 5) + LANE // ch, (LANE % ch) * (16 // (2 - kv8))
        copy = cp_async_bytes16 if kv8 else cp_async16
        dst = r * D + c if kv8 else sw128_offset(r, c, BN) // 2
        copy(smem, ks + dst, o + c, kflat, o >= 0)
        copy(smem, vs + dst, o + c, vflat, o >= 0)
        owned.append(dst)
    return np.stack(owned)


def cp_async_bytes16(stage, dst, src, flat, valid):
    """cp_async16 of e4m3 bytes into a byte-indexed stage (16 elements a copy)."""
    e = np.arange(16)
    stage[dst[:, None] + e] = np.where(valid[:, None], flat[np.where(valid, src, 0)[:, None] + e], 0)


def convert_kv_tile(smem, kf, vf, stage, ks, vs, BN, copied):
    """convert_kv_tile<BN>: each thread's 16 bytes of row i / 8 at byte 16 (i % 8) into two 8-element f16 chunks
    of the swizzled tiles kf, vf (element offsets). Asserts that these are the chunks the thread copied (`copied`,
    load_kv_tile's map: its own cp.async wait is all it waits for) and that a warp's 16-byte stores of one
    instruction meet each bank group of 16 bytes at most 4 times (512 bytes: the 4 wavefronts any such store takes)."""
    for p in range(BN * 8 // THREADS):
        i = p * THREADS + TID
        r, c = i >> 3, (i & 7) * 16
        np.testing.assert_array_equal(16 * i, copied[p])
        for half in range(2):
            dst = sw128_offset(r, c + 8 * half, BN)
            for w in range(THREADS // 32):
                assert np.bincount((dst[32 * w: 32 * w + 32] >> 4) & 7, minlength=8).max() == 4
            for tile, src in ((kf, ks), (vf, vs)):
                smem[tile + dst[:, None] // 2 + np.arange(8)] = stage[src + 16 * i[:, None] + 8 * half + np.arange(8)]


def emulate(q, q_stride, kflat, vflat, offset, tables, qstart, ctx, nh, nkv, scale, T_out, BN, kv8=False):
    """q: flat bf16 values; offset(table, key, kvh): a key's element offset in the flat caches. `kv8`: the caches
    are e4m3 values (the _kv8 kernel: byte stages, converted f16 tiles, Q and P in f16)."""
    NS, TILE = BN // 2, BN * D                        # accumulators per thread; elements of a K/V stage
    STAGES = 2
    AHEAD = STAGES - 1
    out = np.full((T_out, nh, D), np.nan, np.float32)
    G, gx = nh // nkv, math.ceil(int(np.diff(qstart).max()) * nh // nkv / BM)
    srow, scol = acc_rc(BN)
    orow, ocol = acc_rc(D)
    for b, kvh, bx in np.ndindex(len(ctx), nkv, gx):
        q0, n, L = int(qstart[b]), int(qstart[b + 1] - qstart[b]), int(ctx[b])
        rows, row0 = n * G, (gx - 1 - bx) * BM
        if row0 >= rows:
            continue
        kend = L - n + (min(row0 + BM, rows) - 1) // G + 1
        ntiles = (kend + BN - 1) // BN
        smem = np.full((BM * D + 2 * STAGES * TILE), np.nan)    # element-indexed; qs at 0 (1024-byte aligned)
        ks, vs = BM * D, BM * D + STAGES * TILE    # bf16 stages; kv8: buffer j's converted K, V at ks + 2 j TILE
        stage = np.full(2 * STAGES * TILE, np.nan)               # kv8: the e4m3 stages, byte-indexed
        stage_ks, stage_vs = 0, STAGES * TILE
        for p in range(BM * 16 // THREADS):
            r, c = p * 16 + (TID >> 4), (TID & 15) * 8
            row = row0 + r
            src = (q0 + row // G) * q_stride + (kvh * G + row % G) * D + c
            cp_async16(smem, sw128_offset(r, c, BM) // 2, src, q, row < rows)
        key_off = lambda k: offset(tables[b], k, kvh)  # noqa: E731
        into = (stage, stage_ks, stage_vs) if kv8 else (smem, ks, vs)
        copied = load_kv_tile(*into, kflat, vflat, key_off, kend, 0, BN, kv8)
        if kv8:   # tile 1's copies too; Q (each thread its own chunks) and tile 0 converted before the loop
            if 1 < ntiles:
                load_kv_tile(stage, stage_ks + TILE, stage_vs + TILE, kflat, vflat, key_off, kend, BN, BN, kv8)
            smem[: BM * D] = f16(smem[: BM * D])
            convert_kv_tile(smem, ks, ks + TILE, stage, stage_ks, stage_vs, BN, copied)
        kcol = 2 * (LANE & 3)
        wrow = WG * 64 + WARP * 16
        qpos = np.stack([np.where(r < rows, L - n + r // G, -1) for r in
                         (row0 + wrow + (LANE >> 2) + 8 * h for h in range(2))], 1)
        o, m, l_ = np.zeros((THREADS, 64)), np.full((THREADS, 2), -np.inf), np.zeros((THREADS, 2))

        def issue_qk(kaddr):
            s = np.zeros((THREADS, NS))
            for wg in range(2):
                qaddr, S = wg * 64 * SW_ROW, np.zeros((64, BN))
                for kk in range(D // 16):
                    da = desc_sw128(qaddr + (kk >> 2) * BM * SW_ROW + (kk & 3) * 32, 16, 1024)
                    db = desc_sw128(kaddr + (kk >> 2) * BN * SW_ROW + (kk & 3) * 32, 16, 1024)
                    S += kmajor_operand(smem, da, 64) @ kmajor_operand(smem, db, BN).T
                s[wg * 128: wg * 128 + 128] = S[srow, scol]
            return s

        for t in range(ntiles):
            k0, st = t * BN, t % STAGES
            if kv8:   # tile t + 2 into tile t's stage; S of tile t from buffer t % 2 while tile t + 1 converts
                if t + 2 < ntiles:
                    load_kv_tile(stage, stage_ks + st * TILE, stage_vs + st * TILE, kflat, vflat, key_off, kend,
                                 k0 + 2 * BN, BN, kv8)
                kt = ks + (t & 1) * 2 * TILE
                vaddr = 2 * (kt + TILE)
                s = issue_qk(2 * kt)
                if t + 1 < ntiles:
                    nxt = ks + ((t + 1) & 1) * 2 * TILE
                    convert_kv_tile(smem, nxt, nxt + TILE, stage, stage_ks + (st ^ 1) * TILE,
                                    stage_vs + (st ^ 1) * TILE, BN, copied)
            else:
                if t + AHEAD < ntiles:
                    sa = (t + AHEAD) % STAGES
                    load_kv_tile(smem, ks + sa * TILE, vs + sa * TILE, kflat, vflat, key_off, kend, k0 + AHEAD * BN,
                                 BN)
                vaddr = 2 * (vs + st * TILE)
                s = issue_qk(2 * (ks + st * TILE))
            i = np.arange(NS)
            for wg in range(2):
                sel = WG == wg
                if row0 + wg * 64 + 64 > rows or k0 + BN - 1 > L - n + (row0 + wg * 64) // G:
                    masked = k0 + 8 * (i >> 2)[None] + kcol[sel, None] + (i & 1)[None] > qpos[sel][:, (i >> 1) & 1]
                    s[sel] = np.where(masked, -np.inf, s[sel])
            half = [(i >> 1) & 1 == h for h in range(2)]
            mx = np.stack([np.maximum(m[:, h], s[:, half[h]].max(1)) for h in range(2)], 1)
            mx = np.maximum(mx, mx[TID ^ 1])
            mx = np.maximum(mx, mx[TID ^ 2])
            base = np.where(mx == -np.inf, 0.0, mx * scale)
            with np.errstate(invalid="ignore"):
                alpha = np.exp2(m * scale - base)
            m, l_ = mx, l_ * alpha
            s = np.exp2(s * scale - base[:, (i >> 1) & 1])
            l_ += np.stack([s[:, half[h]].sum(1) for h in range(2)], 1)
            o *= alpha[:, (np.arange(64) >> 1) & 1]
            pa = (f16 if kv8 else bf)(s).reshape(THREADS, BN // 16, 4, 2)   # pack16 of s[8kk + 2r], s[8kk + 2r + 1]
            for wg in range(2):
                O = np.zeros((64, D))
                for kk in range(BN // 16):
                    dv = desc_sw128(vaddr + kk * 16 * SW_ROW, BN * SW_ROW, 1024)
                    O += areg_matrix(pa[wg * 128: wg * 128 + 128, kk]) @ mnmajor_operand(smem, dv, D)
                o[wg * 128: wg * 128 + 128] += O[orow, ocol]
        lh = l_ + l_[TID ^ 1]
        lh = lh + lh[TID ^ 2]
        inv = np.where(lh > 0, 1 / np.where(lh > 0, lh, 1), 0)
        for h, j in np.ndindex(2, D // 8):   # every thread's 4-byte word of row g + 8h, columns 8j + kcol
            w = (sw128_offset(wrow + (LANE >> 2) + 8 * h, 8 * j, BM) + 2 * kcol) // 2
            smem[w[:, None] + np.arange(2)] = bf(o[:, 4 * j + 2 * h: 4 * j + 2 * h + 2] * inv[:, h, None])
        for p in range(8):                   # __syncwarp, then every thread's 16-byte stores
            r, c = p * 2 + (LANE >> 4), (LANE & 15) * 8
            row = row0 + wrow + r
            src = sw128_offset(wrow + r, c, BM) // 2
            for t in np.flatnonzero(row < rows):
                out[q0 + row[t] // G, kvh * G + row[t] % G, c[t]: c[t] + 8] = smem[src[t]: src[t] + 8]
    return out


def test_descriptors_read_the_stored_tile():
    """Every k-step's descriptors see exactly Q[:, 16kk:], K[:, 16kk:] (K-major) and V[16kk:, :] (MN-major)
    of tiles stored by sw128_offset, and the layout is what the encoding's fields say."""
    rng = np.random.default_rng(1)
    for R in (64, 128):
        X = rng.standard_normal((R, D))
        smem = np.full(4 * R * D, np.nan)
        at = 2 * R * D                                     # a 1024-aligned element offset, not 0
        for r, c in np.ndindex(R, D // 8):
            dst = at + sw128_offset(r, 8 * c, R) // 2
            smem[dst: dst + 8] = X[r, 8 * c: 8 * c + 8]
        for kk in range(D // 16):
            dk = desc_sw128(2 * at + (kk >> 2) * R * SW_ROW + (kk & 3) * 32, 16, 1024)
            np.testing.assert_array_equal(kmajor_operand(smem, dk, R), X[:, 16 * kk: 16 * kk + 16])
        for kk in range(R // 16):
            dv = desc_sw128(2 * at + kk * 16 * SW_ROW, R * SW_ROW, 1024)
            np.testing.assert_array_equal(mnmajor_operand(smem, dv, D), X[16 * kk: 16 * kk + 16])
    assert desc_sw128(0x1020, 16, 1024) == 0x102 | (1 << 16) | (64 << 32) | (1 << 62)


CASES = {
    # runs (context_len, query_len), nh, nkv
    "varlen_prefix_g4": ([(37, 37), (300, 170), (5, 1), (70, 64), (0, 0), (16, 16)], 8, 2),
    "qwen3_heads_32_8": ([(150, 150), (260, 40)], 32, 8),
    "mha_partial": ([(190, 41), (65, 65)], 2, 2),
    "g16": ([(40, 21), (9, 9)], 16, 1),
}


@pytest.mark.parametrize("kv8", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_wgmma_prefill_emulation_matches_reference(case, kv8):
    runs, nh, nkv = CASES[case]
    c = prefill_case(runs, nh, nkv, D, np.random.default_rng(7), kv8)
    plane, row = c.layers * c.bs * nkv * D, nkv * D

    def offset(table, k, kvh):
        return c.layer * c.bs * row + int(table[k // c.bs]) * plane + (k % c.bs) * row + kvh * D

    got = emulate(c.qbuf.reshape(-1), c.q_row, c.pool[0].reshape(-1), c.pool[1].reshape(-1), offset, c.tables,
                  c.qs, c.lens, nh, nkv, c.scale * 1.4426950408889634, int(c.qs[-1]), 128, kv8)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, c.want, atol=2e-2, rtol=2e-2)


def test_sm90a_build_keeps_the_wgmma_body():
    """The kernel body sits under __CUDA_ARCH_FEAT_SM90_ALL (wgmma needs sm_90a): the Hopper build must keep
    it, all 8 + 8 wgmma of a 128-key K/V tile, in both cache forms."""
    from openinfer.testing.launch_check import ptx_entries, require_nvrtc
    require_nvrtc()
    counts = {name: body.count("wgmma.mma_async") for name, (_, body) in ptx_entries("attention_wgmma").items()}
    assert counts == {"paged_prefill_wgmma_bf16_d128": 16, "paged_prefill_wgmma_bf16_kv8_d128": 16}
