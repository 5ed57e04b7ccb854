"""CPU emulation of moe_wgmma.cu (no GPU), driven by moe.moe_experts_wgmma's recorded launches: each block's
cp.async chunks into swizzled numpy "shared memory" (NaN until written, so a descriptor that reads a byte no copy
wrote poisons the output), the stage ring refilled in the kernel's order, every wgmma read through its descriptors
as the PTX ISA lays out a K-major 128-byte-swizzle operand, the m64n128 accumulator layout and the epilogue; the
align and the combine as test_moe_emulation emulates them. Mirrors the kernel: change both together."""
from __future__ import annotations

import numpy as np
import pytest

from fake_device import flat, run
from openinfer.kernels.cuda import module, moe
from openinfer.kernels.cuda.module import BF16
from openinfer.kernels.cuda.moe import MW_BK, MW_BM, MW_BN, MW_STAGES, MW_THREADS, wgmma_smem
from openinfer.kernels.numpy_mla_moe import moe_experts as ref_moe_experts
from openinfer.testing.launch_check import fake, record_launches
from test_attention_mma_emulation import bf
from test_attention_wgmma_emulation import acc_rc, desc_sw128, kmajor_operand
from test_moe_emulation import emulate_align, emulate_combine

TILE = MW_BM * MW_BK   # elements of one swizzled [128][64] tile
TID = np.arange(MW_THREADS)
ROW, COL = acc_rc(MW_BN)   # [128 threads][64 registers] of a warpgroup


def copy_chunks(smem, tile, rows, k0, K, src):
    """copy_chunk for every chunk of a [128][64] tile: rows[r] an element offset into src or -1 (zeros)."""
    for p in range(MW_BM * 8 // MW_THREADS):
        i = p * MW_THREADS + TID
        r, c = i >> 3, i & 7
        k = k0 + c * 8
        ok = (rows[r] >= 0) & (k < K)
        dst = tile + r * 64 + ((c ^ (r & 7)) << 3)   # elements: 16-byte chunk (c ^ r % 8) of the 128-byte row r
        e = np.arange(8)
        smem[dst[:, None] + e] = np.where(ok[:, None], src[np.where(ok, rows[r] + k, 0)[:, None] + e], 0)


def emulate_block(gate_up, a, a_stride, srt, topk, w, N, K, r0, r1, bx, route_w, out, out_stride):
    m = min(MW_BM, r1 - r0)
    n0 = bx * (MW_BN // 2 if gate_up else MW_BN)
    pair_of = np.array([srt[r0 + i] if i < m else -1 for i in range(MW_BM)])
    a_rows = np.where(pair_of < 0, -1, (pair_of // topk if gate_up else r0 + np.arange(MW_BM)) * a_stride)
    r = np.arange(MW_BN)
    col = n0 + (r % (MW_BN // 2) if gate_up else r)
    w_rows = np.where(col >= N, -1, np.where(gate_up & (r >= MW_BN // 2), N + col, col) * K)
    smem = np.full(MW_STAGES * 2 * TILE, np.nan)

    def load_stage(s, k0):
        base = (s % MW_STAGES) * 2 * TILE
        copy_chunks(smem, base, a_rows, k0, K, a)
        copy_chunks(smem, base + TILE, w_rows, k0, K, w)

    nk = -(-K // MW_BK)
    for s in range(MW_STAGES - 2):
        if s < nk:
            load_stage(s, s * MW_BK)
    acc = np.zeros((2, 64, MW_BN))
    for kt in range(nk):
        pre = kt + MW_STAGES - 2
        if pre < nk:
            load_stage(pre, pre * MW_BK)   # the slot of step kt - 2, never the one read below
        st = 2 * (kt % MW_STAGES) * TILE * 2   # byte address
        for wg in range(2):
            for kk in range(MW_BK // 16):
                da = desc_sw128(st + wg * 64 * 128 + kk * 32, 16, 1024)
                db = desc_sw128(st + TILE * 2 + kk * 32, 16, 1024)
                acc[wg] += kmajor_operand(smem, da, 64) @ kmajor_operand(smem, db, MW_BN).T
    lane, warp, tq = TID & 31, (TID >> 5) & 3, TID & 3
    for t in TID:
        wg, regs = t >> 7, acc[t >> 7][ROW[t & 127], COL[t & 127]]
        for h in range(2):
            row = wg * 64 + warp[t] * 16 + (lane[t] >> 2) + 8 * h
            if row >= m:
                continue
            if gate_up:
                for j in range(8):
                    for c in range(2):
                        cc = n0 + 8 * j + 2 * tq[t] + c
                        if cc < N:
                            g, u = regs[4 * j + 2 * h + c], regs[32 + 4 * j + 2 * h + c]
                            out[(r0 + row) * out_stride + cc] = bf(g / (1 + np.exp(-g)) * u)
            else:
                p = pair_of[row]
                for j in range(16):
                    for c in range(2):
                        cc = n0 + 8 * j + 2 * tq[t] + c
                        if cc < N:
                            out[p * out_stride + cc] = route_w[p] * regs[4 * j + 2 * h + c]


def emulate_gemm(call):
    """moe_gate_up_bf16_wgmma / moe_down_bf16_wgmma on their recorded arguments."""
    gate_up = call.name.startswith("moe_gate_up")
    a, a_stride, sorted_pairs, topk, w, w_expert_stride, N, K, te, ts, tend, num_tiles = call.args[:12]
    route_w, out, out_stride = (None, *call.args[12:]) if gate_up else call.args[12:]
    assert call.block == MW_THREADS and call.smem == wgmma_smem()
    assert call.grid[0] == -(-int(N) // (MW_BN // 2 if gate_up else MW_BN))
    af, wf, srt = flat(a).astype(np.float32), flat(w).astype(np.float32), flat(sorted_pairs)
    used = int(flat(num_tiles)[0])
    assert used <= call.grid[1]
    for slot in range(used):
        e, r0, r1 = int(flat(te)[slot]), int(flat(ts)[slot]), int(flat(tend)[slot])
        we = wf[e * int(w_expert_stride):]
        for bx in range(call.grid[0]):
            emulate_block(gate_up, af, int(a_stride), srt, int(topk), we, int(N), int(K), r0, r1, bx,
                          None if route_w is None else flat(route_w), flat(out), int(out_stride))


@pytest.fixture
def launches(monkeypatch):
    return record_launches(monkeypatch, (moe, module))


# T, D, I, local experts, top-k, experts routed over, offset: a ragged last k stage (D 72) and outputs off the n
# tiles (I 40), two tiles an expert; K of six stages (more than the ring) with an expert-parallel shard
CASES = {"ragged": (150, 72, 40, 2, 2, 2, 0), "deep_shard": (140, 384, 136, 2, 3, 6, 2)}


@pytest.mark.parametrize("case", list(CASES))
def test_moe_experts_wgmma_emulation(case, launches):
    """moe.moe_experts_wgmma at 128-row tiles on a strided x with a shared-expert addend, its four launches
    emulated, against numpy_mla_moe.moe_experts."""
    T, D, I, E, k, n_ids, offset = CASES[case]
    rng = np.random.default_rng(len(case))
    x = fake(rng.standard_normal((T, D + 8)), BF16)[:, 8:]
    gate_up = fake(rng.standard_normal((E, 2 * I, D)) * D ** -0.5, BF16)
    down = fake(rng.standard_normal((E, D, I)) * I ** -0.5, BF16)
    ids = fake(np.argsort(rng.random((T, n_ids)), axis=-1)[:, :k].astype(np.int32))
    weights = fake(rng.random((T, k)).astype(np.float32))
    addend = fake(rng.standard_normal((T, D)), BF16)
    y = moe.moe_experts_wgmma(x, gate_up, down, ids, weights, offset, addend)
    assert [c.name for c in launches][1:3] == ["moe_gate_up_bf16_wgmma", "moe_down_bf16_wgmma"]
    run(launches, {"moe_align": lambda c: emulate_align(c, rng), "moe_gate_up": emulate_gemm,
                   "moe_down": emulate_gemm, "moe_combine": emulate_combine})
    f64 = [np.asarray(a, np.float64) for a in (x, gate_up, down)]
    want = ref_moe_experts(*f64, np.asarray(ids), np.asarray(weights), offset, np.asarray(addend, np.float64))
    np.testing.assert_allclose(np.asarray(y, np.float32), want, atol=2e-2, rtol=2e-2)


def test_small_batches_keep_the_16_row_tiles(launches):
    """Below 64 rows an expert on average the wgmma implementation runs the mma.sync 16-row tiles as "grouped"."""
    T, D, I, E, k = 8, 64, 32, 4, 2
    rng = np.random.default_rng(0)
    moe.moe_experts_wgmma(fake(rng.standard_normal((T, D)), BF16), fake(rng.standard_normal((E, 2 * I, D)), BF16),
                          fake(rng.standard_normal((E, D, I)), BF16),
                          fake(np.argsort(rng.random((T, E)), axis=-1)[:, :k].astype(np.int32)),
                          fake(rng.random((T, k)).astype(np.float32)), 0)
    assert [c.name for c in launches][1:3] == ["moe_gate_up_bf16_m1_s6", "moe_down_bf16_m1_s6"]
