"""CPU emulation of quant_mma.cu, the INT4 routed experts at decode on the tensor cores (no GPU):
quant.moe_experts_quant at decode sizes, its recorded launches (moe_plan, moe_q_mma_gate_up_int4,
moe_q_mma_down_int4, the combine) run warp by warp, each mma assembled from its lanes' fragment registers as the PTX
layout of m16n8k16 places them (A rows g and g + 8, k 2t, 2t + 1, 2t + 8, 2t + 9; B k rows and column g; C rows g,
g + 8 and columns 2t, 2t + 1), so the kernels' map of physical weights to logical k (nibbles j and j + 4 of lane
t's word in one register) is checked against the activations' map: a mismatch sums the wrong products. The down
kernel's stage is modelled word by word (bf16 hi and lo parts of h, its padding), against
numpy_quant.moe_experts_quant. Mirrors the kernels: change both together."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cupy")
from fake_device import flat, run  # noqa: E402
from openinfer.kernels import numpy_quant  # noqa: E402
from openinfer.kernels.cuda import module, moe, quant  # noqa: E402
from openinfer.quant import Int4Weight  # noqa: E402
from openinfer.testing.launch_check import fake, record_launches  # noqa: E402
from test_quant_gemm_emulation import emulate_qcombine  # noqa: E402
from test_quant_launch_args import _plan, _random_stack  # noqa: E402

BF16 = module.BF16
WARPS, PAIRS = quant.MMA_WARPS, quant.MMA_PAIRS


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bf16 (ties to even), as float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def int4_pairs(word: int) -> list[tuple[float, float]]:
    """quant_mma.cu's int4_pairs: the (nibble j, nibble j + 4) values, nibble - 8, of one word, j = 0..3."""
    return [(((word >> 4 * j) & 15) - 8.0, ((word >> 4 * (j + 4)) & 15) - 8.0) for j in range(4)]


def mma(a_regs, b_regs) -> np.ndarray:
    """m16n8k16 from 32 lanes' registers: a_regs[lane] = 4 (lo, hi) pairs (a0..a3), b_regs[lane] = 2 pairs (b0, b1);
    returns C [16, 8] (float64: the exact products' sums)."""
    A, B = np.full((16, 16), np.nan), np.full((16, 8), np.nan)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for reg, (row, col) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            A[row, col: col + 2] = a_regs[lane][reg]
        for reg, k in enumerate((2 * t, 2 * t + 8)):
            B[k: k + 2, g] = b_regs[lane][reg]
    assert not np.isnan(A).any() and not np.isnan(B).any(), "every fragment element set"
    return A @ B


def c_of(C: np.ndarray, lane: int) -> list[float]:
    g, t = divmod(lane, 4)
    return [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]


def mma_rows(q, s, tile, K, b_of) -> np.ndarray:
    """quant_mma.cu's mma_rows for the warp of tile `tile` of the staged stack (q words, s bf16 scales, read at the
    kernel's addresses); b_of(lane, c)[m] -> the lane's B registers of chunk c's mma m, one (b0, b1) per part
    (gate_up: one; down: hi, lo), each b a (lo, hi) pair of values; returns acc [32, 4] (lane: C rows g, g + 8 x
    columns 2t, 2t + 1), each chunk's sums scaled once."""
    words, scales = flat(q).view(np.uint32), flat(s).view(np.uint16).astype(np.uint32)
    C, pairs = K // 32, -(-K // 64)

    def word(i, c, t):   # wg + 64 c (+ 32 for row g + 8): word t of tile row i's chunk c
        return int(words[(tile * C * 16 + i) * 4 + t + 64 * c])

    def scale(i, c):     # half c % 2 of the bf16x2 word sg + 16 (c / 2) (+ 8 for row g + 8)
        at = 2 * (tile * pairs * 16 + 16 * (c // 2) + i) + c % 2
        return float((scales[at] << 16).astype(np.uint32).view(np.float32))

    acc = np.zeros((32, 4))
    for c in range(C):
        part = np.zeros((32, 4))
        for m in range(2):
            a_regs = []
            for lane in range(32):
                g, t = divmod(lane, 4)
                pg, pg8 = (int4_pairs(word(i, c, t)) for i in (g, g + 8))
                a_regs.append((pg[2 * m], pg8[2 * m], pg[2 * m + 1], pg8[2 * m + 1]))
            b = [b_of(lane, c)[m] for lane in range(32)]
            for i in range(len(b[0])):
                prod = mma(a_regs, [b[lane][i] for lane in range(32)])
                part += [c_of(prod, lane) for lane in range(32)]
        for lane in range(32):
            g = lane // 4
            s0, s1 = scale(g, c), scale(g + 8, c)
            acc[lane] += np.array([s0, s0, s1, s1]) * part[lane]
    return acc


def b_pairs(v):
    """A lane's (b0, b1) of each of a chunk's two mmas from its 8 activations v (positions 8t .. 8t + 7):
    b0 = (v[2m], v[2m + 4]), b1 = (v[2m + 1], v[2m + 5])."""
    return [((v[2 * m], v[2 * m + 4]), (v[2 * m + 1], v[2 * m + 5])) for m in range(2)]


def _plan_of(call):
    slot_expert, slot_start, pair_list = (flat(a) for a in call.args[3:6])
    return slot_expert, slot_start, pair_list


def emulate_gate_up(call):
    x, q, s, _, _, _, k, D, I, h = call.args
    k, D, I = int(k), int(D), int(I)
    slot_expert, slot_start, pair_list = _plan_of(call)
    X = flat(x).astype(np.float32)
    assert call.block == 32 * WARPS and call.grid[0] == -(-I // (8 * WARPS)) and call.smem == 0
    for slot in range(call.grid[1]):
        e = int(slot_expert[slot])
        if e < 0:
            continue
        first, last = int(slot_start[slot]), int(slot_start[slot + 1])
        for j in range(call.grid[0] * WARPS):
            o0 = 8 * j
            if o0 >= I:   # the whole warp returns
                continue
            for p0 in range(first, last, PAIRS):
                n = min(PAIRS, last - p0)

                def b_of(lane, c, p0=p0, n=n):
                    g, t = divmod(lane, 4)
                    at = int(pair_list[p0 + min(g, n - 1)]) // k * D + 32 * c + 8 * t
                    return [[b] for b in b_pairs(X[at: at + 8])]
                acc = mma_rows(q, s, e * (I // 8) + j, D, b_of)   # tile rows g, g + 8: output o0 + g's gate, up
                for lane in range(32):
                    g, t = divmod(lane, 4)
                    for i in range(2):
                        if 2 * t + i < n:
                            gate, up = acc[lane][i], acc[lane][2 + i]
                            flat(h)[int(pair_list[p0 + 2 * t + i]) * I + o0 + g] = gate / (1 + np.exp(-gate)) * up


def emulate_down(call):
    h, q, s, _, _, _, weights, D, I, stage_pairs, yk = call.args
    D, I, staged = int(D), int(I), int(stage_pairs)
    slot_expert, slot_start, pair_list = _plan_of(call)
    H, W = flat(h).astype(np.float32), flat(weights)
    C = I // 32
    pair_words = 32 * C + quant.MMA_STAGE_PAD
    assert call.block == 32 * WARPS and call.grid[0] == -(-D // (16 * WARPS))
    assert call.smem == quant.mma_stage_bytes_down(I, staged) == staged * pair_words * 4
    for slot in range(call.grid[1]):
        e = int(slot_expert[slot])
        if e < 0:
            continue
        first, last = int(slot_start[slot]), int(slot_start[slot + 1])
        for p0 in range(first, last, staged):
            n = min(staged, last - p0)
            stage = np.full((staged * pair_words, 2), np.nan)   # a word: its (lo, hi) bf16 values
            for i in range(n * C * 4):   # the staging threads: (pair, chunk, lane t) -> 8 words
                p, c, tt = i // (C * 4), (i >> 2) % C, i & 3
                at = int(pair_list[p0 + p]) * I + 32 * c + 8 * tt
                v = H[at: at + 8]
                hi = bf16_round(v)
                lo = bf16_round(v - hi)
                base = p * pair_words + 32 * c + 8 * tt
                for m in range(2):
                    (h0, h1), (l0, l1) = b_pairs(hi)[m], b_pairs(lo)[m]
                    stage[base + 4 * m: base + 4 * m + 4] = [h0, h1, l0, l1]
            for j in range(call.grid[0] * WARPS):
                if 16 * j >= D:
                    continue

                def b_of(lane, c, n=n):
                    g, t = divmod(lane, 4)
                    at = min(g, n - 1) * pair_words + 8 * t + 32 * c
                    w = stage[at: at + 8]
                    assert not np.isnan(w).any(), "a staged word read before it is written"
                    return [[(tuple(w[4 * m]), tuple(w[4 * m + 1])), (tuple(w[4 * m + 2]), tuple(w[4 * m + 3]))]
                            for m in range(2)]   # mma m: the hi part's (b0, b1), the lo part's
                acc = mma_rows(q, s, e * (D // 16) + j, I, b_of)
                for lane in range(32):
                    g, t = divmod(lane, 4)
                    for i in range(4):   # tile rows g and g + 8: rows 8j + g and D/2 + 8j + g
                        p, r = 2 * t + (i & 1), 8 * j + g + (i >> 1) * (D // 2)
                        if p < n:
                            pair = int(pair_list[p0 + p])
                            flat(yk)[pair * D + r] = W[pair] * acc[lane][i]


def emulate_plan(call):
    ids, n, E_local, offset, slots, slot_expert, slot_start, pair_list = call.args
    se, ss, pl = _plan(flat(ids)[: int(n)], int(E_local), int(offset), int(slots))
    flat(slot_expert)[: len(se)] = se
    flat(slot_start)[: len(ss)] = ss
    flat(pair_list)[: len(pl)] = pl


@pytest.fixture
def launches(monkeypatch):
    return record_launches(monkeypatch, (quant, moe, module))


# (T, k, E_local, offset, D, I): one token; a batch whose expert takes more pairs than a pass (9 > 8: a second pass
# of one) with warps past the outputs (I 96: 12 of 16 gate_up warps work) and past the rows (D 96: 6 of 8 down
# warps).
CASES = {"one_token": (1, 4, 6, 0, 64, 64), "passes": (9, 3, 4, 1, 96, 96)}


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_core_expert_emulation(case, launches):
    T, k, E, offset, D, I = CASES[case]
    rng = np.random.default_rng(len(case))
    gate_up, down = (_random_stack(rng, "int4", E, *shape).tiles() for shape in ((2 * I, D), (D, I)))
    dev = [Int4Weight(fake(w.packed), fake(w.scale, BF16), True) for w in (gate_up, down)]
    host = [Int4Weight(np.asarray(w.packed), np.asarray(w.scale, np.float32), True) for w in dev]
    x = fake(rng.standard_normal((T, D)), BF16)
    ids = np.argsort(rng.random((T, E + 2)), axis=-1)[:, :k].astype(np.int32)   # some experts on another rank
    if case == "passes":
        ids[:, 0] = offset + 1   # every token picks one expert: 9 pairs, passes of 8
    weights = rng.random((T, k)).astype(np.float32)
    assert quant.tensor_core_gemv("int4", BF16) and not quant.tensor_core_gemv("fp8", BF16)
    y = quant.moe_experts_quant(x, dev[0], dev[1], fake(ids), fake(weights), offset)
    assert [c.name for c in launches] == ["moe_plan", "moe_q_mma_gate_up_int4", "moe_q_mma_down_int4",
                                          "moe_combine_bf16"]
    run(launches, {"moe_plan": emulate_plan, "moe_q_mma_gate_up": emulate_gate_up, "moe_q_mma_down": emulate_down,
                   "moe_combine": emulate_qcombine})
    want = numpy_quant.moe_experts_quant(np.asarray(x, np.float32), host[0], host[1], ids, weights, offset)
    # the products are the reference's, h's are to ~2^-17 (hi + lo); y is rounded to bf16 once
    np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=1e-2, atol=1e-2)
