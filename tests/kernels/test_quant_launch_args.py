"""CPU checks of the quantized-weight kernels (quant.cu): every launch's arguments against the compiled parameter
lists (no GPU), and a numpy emulation of the kernels' own indexing (the INT4 and FP8 bit decoding, the expert plan, the
rows of each warp, the per-slot passes, the combine order) against the numpy references."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cupy")
from openinfer.kernels import numpy_quant  # noqa: E402
from openinfer.kernels.cuda import module, moe, quant  # noqa: E402
from openinfer.quant import Fp8Weight, Int4Weight, e4m3_to_f32, quantize_fp8, quantize_int4, row_scales  # noqa: E402
from openinfer.quant.int4 import tile_int4, tile_position, tiled_shapes, unpack_int4  # noqa: E402
from openinfer.testing.launch_check import fake, record_launches  # noqa: E402

BF16 = module.BF16


@pytest.fixture
def launches(monkeypatch):
    recorded = record_launches(monkeypatch, (quant, moe, module))
    monkeypatch.setattr(quant, "linear", lambda x, w: recorded.append(("gemm", x.shape, w.shape)))
    return recorded


def _weights(fmt, out, inp, stack, dtype):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((stack, out, inp))
    if fmt == "int4":
        q, s = quantize_int4(w)
        if stack > 1:   # an expert stack, staged tiled
            return Int4Weight(*(fake(a, dt) for a, dt in zip(tile_int4(q, s), (None, dtype))), True)
        return Int4Weight(fake(q), fake(s, dtype))
    qs = [quantize_fp8(m) for m in w]
    return Fp8Weight(fake(np.stack([q for q, _ in qs])), fake(np.stack([row_scales(s, out) for _, s in qs])))


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_quant_launches(launches, fmt, dtype):
    lin = _weights(fmt, 96, 256, 1, dtype)
    lin = type(lin)(*(a[0] for a in ((lin.packed, lin.scale) if fmt == "int4" else (lin.data, lin.scale))))
    quant.linear_quant(fake(np.zeros((5, 256)), dtype), lin)
    quant.linear_quant(fake(np.zeros((40, 256)), dtype), lin)   # prefill: dequantize, then the GEMM
    assert [c.name if hasattr(c, "name") else c[0] for c in launches] == [
        f"q_gemv_{fmt}_{module.suffix(dtype)}", f"q_dequant_{fmt}_{module.suffix(dtype)}", "gemm"]
    launches.clear()
    gu, dn = _weights(fmt, 2 * 64, 256, 6, dtype), _weights(fmt, 256, 64, 6, dtype)
    quant.moe_experts_quant(fake(np.zeros((3, 256)), dtype), gu, dn, fake(np.zeros((3, 4), np.int32)),
                            fake(np.ones((3, 4), np.float32)), 2, fake(np.zeros((3, 256)), dtype))
    names = [c.name for c in launches]
    sfx = module.suffix(dtype)   # rows of 256 and 64 weights: whole-warp rows, 4 a warp, one chunk a lane and pass
    if quant.tensor_core_gemv(fmt, dtype):   # INT4 on bf16: 8 outputs (gate_up) and 16 rows (down) a warp
        assert names == ["moe_plan", "moe_q_mma_gate_up_int4", "moe_q_mma_down_int4", f"moe_combine_{sfx}"]
        assert launches[1].grid == (1, 6) and launches[2].grid == (2, 6)
    else:
        assert names == ["moe_plan", f"moe_q_gate_up_{fmt}_{sfx}_l32r4u1", f"moe_q_down_{fmt}_{sfx}_l32r4u1",
                         f"moe_combine_{sfx}"]
        assert launches[1].grid == (4, 6) and launches[2].grid == (8, 6)   # slots: min(E_local, T * k)
    launches.clear()
    quant.MOE_CHUNK, chunk = 2, quant.MOE_CHUNK
    try:   # 5 tokens in chunks of 2: three passes of the four launches, the last over one token
        quant.moe_experts_quant(fake(np.zeros((5, 256)), dtype), gu, dn, fake(np.zeros((5, 4), np.int32)),
                                fake(np.ones((5, 4), np.float32)), 0)
    finally:
        quant.MOE_CHUNK = chunk
    assert [c.name for c in launches] == names * 3 and launches[-1].grid == (1, 1)


# Kimi-K2's experts (hidden 7168, width 2048) at one token: (gate_up kernel, grid x), (down kernel, grid x); a block
# is 8 warps. INT4: quant_mma.cu's, 8 outputs and 16 rows a warp. FP8: whole-warp rows, 4 a warp (gate_up: 2
# outputs), one chunk a lane and pass.
KIMI_GRIDS = {"int4": (("moe_q_mma_gate_up_int4", 2048 // 64), ("moe_q_mma_down_int4", 7168 // 128)),
              "fp8": (("moe_q_gate_up_fp8_bf16_l32r4u1", 2048 // 16), ("moe_q_down_fp8_bf16_l32r4u1", 7168 // 32))}


def test_expert_pass_forms():
    """Whole-warp rows, 4 a warp: INT4 rows of more than 64 chunks two chunks a lane and pass, shorter INT4 rows and
    every FP8 row one."""
    forms = [quant.expert_pass("int4", K).name for K in (32, 2048, 2080, 7168)]
    assert forms == ["l32r4u1", "l32r4u1", "l32r4u2", "l32r4u2"]
    assert [quant.expert_pass("fp8", K).name for K in (16, 1024, 1040, 7168)] == ["l32r4u1"] * 4
    assert {quant.expert_pass(f, K).warp_rows for f in ("int4", "fp8") for K in (32, 7168)} == {4}


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_kimi_expert_launches(launches, fmt):
    D, I, E, k, T = 7168, 2048, 3, 8, 1   # three experts: the grid's x depends only on the shape
    if fmt == "int4":
        gu, dn = (Int4Weight(*(fake(np.zeros((E, *shape), dt)) for shape, dt in
                               zip(tiled_shapes(N, K), (np.int32, BF16))), True) for N, K in ((2 * I, D), (D, I)))
    else:
        gu = Fp8Weight(fake(np.zeros((E, 2 * I, D), np.uint8)), fake(np.zeros((E, 2 * I, D // 128), np.float32)))
        dn = Fp8Weight(fake(np.zeros((E, D, I), np.uint8)), fake(np.zeros((E, D, I // 128), np.float32)))
    quant.moe_experts_quant(fake(np.zeros((T, D)), BF16), gu, dn, fake(np.zeros((T, k), np.int32)),
                            fake(np.ones((T, k), np.float32)), 0)
    (gu_name, gu_x), (dn_name, dn_x) = KIMI_GRIDS[fmt]
    slots = min(E, T * k)   # fixed by the token count: the launches can be captured per batch size
    assert [(c.name, c.grid, c.block) for c in launches[1:3]] == [(gu_name, (gu_x, slots), 256),
                                                                  (dn_name, (dn_x, slots), 256)]
    # down stages its pass's float32 h rows: one pair (one token) of 2048; INT4 as bf16 hi and lo parts, 4 words
    # more; FP8 16 bytes a chunk more
    chunk = quant.CHUNK_WEIGHTS[fmt]
    staged = (I * 4 + 16) if fmt == "int4" else I // chunk * (4 * chunk + 16)
    assert [c.smem for c in launches[1:3]] == [0, staged]


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_staged_activations_emulation(fmt, itemsize):
    """quant.cu's stage_rows and warp_rows' reads of the stage (the down kernel's) as they index: every chunk's values
    come back from where warp_rows reads them (c * SC + 8 * j), and a warp's 16-byte reads of one chunk-word (lane l:
    chunk l) fall in the eight distinct 16-byte bank groups of each quarter warp (no bank conflict)."""
    chunk, K, n = quant.CHUNK_WEIGHTS[fmt], 4 * 1024, 3
    V, C = 16 // itemsize, K // quant.CHUNK_WEIGHTS[fmt]
    SC = chunk + 16 // itemsize        # staged_chunk<F, A>
    rows = np.arange(n * K).reshape(n, K)
    stage = np.full(n * C * SC, -1)
    words = K // V
    for i in range(n * words):          # one thread's 16-byte word per i
        p, w = divmod(i, words)
        c = w // (chunk // V)
        at = (p * C + c) * SC + V * w - c * chunk
        stage[at:at + V] = rows[p, V * w:V * w + V]
    assert quant.stage_bytes(fmt, K, itemsize, n) == n * C * SC * itemsize
    for p in range(n):
        act = p * C * SC
        for c in range(C):
            for j in range(chunk // 8):
                np.testing.assert_array_equal(stage[act + c * SC + 8 * j: act + c * SC + 8 * j + 8],
                                              rows[p, c * chunk + 8 * j: c * chunk + 8 * j + 8])
        for j in range(chunk // 8):     # lanes 0..31 read chunks c0 + lane, word j, 16 bytes at a time
            for part in range(8 * itemsize // 16):
                byte = [((act + lane * SC + 8 * j) * itemsize + 16 * part) for lane in range(32)]
                for quarter in range(4):
                    groups = {(b // 16) % 8 for b in byte[8 * quarter: 8 * quarter + 8]}
                    assert len(groups) == 8, (j, part, quarter)


def test_quant_refuses_misshapen_weights(launches):
    w = _weights("int4", 8, 64, 1, BF16)
    with pytest.raises(TypeError, match="INT4 scales"):
        quant.linear_quant(fake(np.zeros((1, 64)), np.float32), Int4Weight(w.packed[0], w.scale[0]))
    words = fake(np.zeros(8 * 8 + 1, np.int32))[1:].reshape(8, 8)   # 4 bytes past an aligned start
    with pytest.raises(ValueError, match="16-byte aligned"):
        quant.linear_quant(fake(np.zeros((1, 64)), BF16), Int4Weight(words, w.scale[0]))
    fp8 = Fp8Weight(fake(np.zeros((8, 24), np.uint8)), fake(np.ones((8, 1), np.float32)))   # rows of 1.5 chunks
    with pytest.raises(ValueError, match="divisible by 16"):
        quant.linear_quant(fake(np.zeros((1, 24)), BF16), fp8)


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_quant_reads_aligned_rows(launches, fmt):
    """A contiguous row that starts off a 16-byte boundary (one token's column slice) reaches the kernels as an
    aligned copy: they read the activations as 16-byte words."""
    x = fake(np.arange(264, dtype=np.float32).reshape(1, 264), BF16)[:, 4:260]   # 8 bytes past an aligned start
    assert x.flags.c_contiguous and x.data.ptr % 16 == 8
    lin = _weights(fmt, 96, 256, 1, BF16)
    lin = type(lin)(*(a[0] for a in quant._arrays(lin)))
    quant.linear_quant(x, lin)
    gu, dn = _weights(fmt, 2 * 64, 256, 6, BF16), _weights(fmt, 256, 64, 6, BF16)
    quant.moe_experts_quant(x, gu, dn, fake(np.zeros((1, 4), np.int32)), fake(np.ones((1, 4), np.float32)), 0)
    for call in (launches[0], launches[2]):   # q_gemv, moe_q_gate_up: x is their first argument
        assert call.args[0].data.ptr % 16 == 0 and np.array_equal(call.args[0], x), call.name


# ---- emulation: quant.cu's arithmetic and indexing in numpy ----

def _int4_expand(words: np.ndarray) -> np.ndarray:
    """Int4::expand of each uint32 word -> float32 [..., 8] (nibble - 8): nibble i masked in as the mantissa of a
    float whose exponent makes it 2^(23 - 4i) + nibble (nibbles 5..7 after a shift by 20), less that power and 8."""
    words = np.asarray(words, np.uint32)
    out = []
    for i in range(8):
        b = i if i < 5 else i - 5
        src = words if i < 5 else words >> np.uint32(20)
        bits = (src & np.uint32(15 << 4 * b)) | np.uint32((150 - 4 * b) << 23)
        out.append(bits.view(np.float32) - np.float32((1 << (23 - 4 * b)) + 8))
    return np.stack(out, axis=-1)


def _fp8_expand(words: np.ndarray) -> np.ndarray:
    """Fp8::expand of each uint32 word (4 e4m3 bytes) -> float32 [..., 4], the weights / 2^8: f16 bits of bytes 1
    and 3 from the word, of bytes 0 and 2 from the word shifted left by 8 (Fp8::halves), each half to f32."""
    words = np.ascontiguousarray(words, np.uint32)

    def halves(v):   # [..., 2] f32: the low half, then the high one
        h = ((v & np.uint32(0x80008000)) | ((v & np.uint32(0x7F007F00)) >> np.uint32(1))).astype(np.uint32)
        return h.view(np.float16).reshape(*v.shape, 2).astype(np.float32)
    odd, even = halves(words), halves(words << np.uint32(8))
    return np.stack([even[..., 0], odd[..., 0], even[..., 1], odd[..., 1]], axis=-1)


def _bf16_bits(bits: np.ndarray) -> np.ndarray:
    """16-bit patterns as the bf16 values they hold (float32)."""
    return (np.asarray(bits, np.uint32) << np.uint32(16)).view(np.float32)


def int4_expand_bf16(words: np.ndarray) -> np.ndarray:
    """Int4::expand_bf16 of each uint32 word -> float32 [..., 8]: for weights 2p, 2p + 1 the nibbles masked into a
    bf16 pair 0x4300 | nibble (128 + nibble), then 136 subtracted (a bf16x2 fma, exact: the results are integers)."""
    words = np.asarray(words, np.uint32)
    out = []
    for p in range(4):
        t = words >> np.uint32(8 * p)
        biased = (t & np.uint32(0xF)) | ((t << np.uint32(12)) & np.uint32(0xF0000)) | np.uint32(0x43004300)
        for half in (biased & np.uint32(0xFFFF), biased >> np.uint32(16)):
            out.append(_bf16_bits(half) - np.float32(136))
    return np.stack(out, axis=-1)


def fp8_expand_bf16(words: np.ndarray) -> np.ndarray:
    """Fp8::expand_bf16 of each uint32 word (4 e4m3 bytes) -> float32 [..., 4]: byte b's bits placed as a float's
    (sign on top, exponent and mantissa from bit 20: the weight / 2^120, a denormal for the e4m3 subnormals), times
    2^120 in float32 (numpy keeps denormals, as the kernels built without flush-to-zero do); the upper half of each
    product is the bf16 packed (byte_perm), so its lower half must be zero."""
    words = np.asarray(words, np.uint32)
    out = []
    for b in range(4):
        t = (words.astype(np.uint64) << np.uint64(24 - 8 * b)).astype(np.uint32)
        bits = (t & np.uint32(0x80000000)) | ((t >> np.uint32(4)) & np.uint32(0x07F00000))
        f = bits.view(np.float32) * np.float32(2.0 ** 120)
        assert not (f.view(np.uint32) & np.uint32(0xFFFF)).any(), "a product with bits below the bf16 half"
        out.append(f)
    return np.stack(out, axis=-1)


@pytest.mark.parametrize("expand", [_int4_expand, int4_expand_bf16])
def test_int4_bit_decoding_matches_unpacking(expand):
    words = np.random.default_rng(2).integers(0, 2**32, 4096, dtype=np.uint32)   # every nibble at every place
    np.testing.assert_array_equal(expand(words).reshape(-1), unpack_int4(words.view(np.int32)))


@pytest.mark.parametrize("expand,unit", [(_fp8_expand, 256), (fp8_expand_bf16, 1)])
def test_fp8_bit_decoding_matches_the_table(expand, unit):
    """Each of the 256 bytes at each place of a word (byte j of word i is b[i - j]); `unit`: what the expansion's
    values are in (the GEMV's: the weights / 2^8)."""
    b = np.arange(256, dtype=np.uint32)
    words = (b | (np.roll(b, 1) << 8) | (np.roll(b, 2) << 16) | (np.roll(b, 3) << 24)).astype(np.uint32)
    got = expand(words) * np.float32(unit)
    raw = np.stack([np.roll(b, j) for j in range(4)], axis=-1)
    finite = (raw & 0x7F) != 0x7F   # NaN is not produced (checkpoints hold none)
    np.testing.assert_array_equal(got[finite], e4m3_to_f32(raw.astype(np.uint8))[finite])


CHUNK = {"int4": 32, "fp8": 16}   # weights of a 16-byte chunk (quant.py's CHUNK_WEIGHTS)


def _stack_row(fmt, e, r, N):
    """F::stack_row: row r of expert e (N rows an expert); INT4 stacks are staged tiled (Int4Tiles)."""
    if fmt == "fp8":
        return e * N + r
    tile, i = tile_position(r, N)
    return (e * (N // 16) + tile) * 16 + i


def _row_chunks(fmt, q, scale, row, K):
    """Stack row `row` of a flat stack as warp_rows reads it: (unscaled weights [C, CHUNK], scale [C]), chunk c
    from the 16 bytes at F::chunk_index of the stack seen as 16-byte words, its scale at F::scale_index."""
    C = K // CHUNK[fmt]
    if fmt == "int4":   # Int4Tiles
        c = np.arange(C)
        words = q.reshape(-1).view(np.uint32).reshape(-1, 4)[((row >> 4) * C + c) * 16 + (row & 15)]
        at = ((row >> 4) * 2 * -(-C // 2) + c - c % 2) * 16 + 2 * (row & 15) + c % 2
        return _int4_expand(words).reshape(C, 32), scale.reshape(-1)[at].astype(np.float32)
    words = q.reshape(-1).view(np.uint32).reshape(-1, 4)[row * C: row * C + C]
    nb = -(-K // 128)
    return (_fp8_expand(words).reshape(C, 16),
            scale.reshape(-1)[row * nb + np.arange(C) // 8].astype(np.float32) * np.float32(256))


def _warp_rows(fmt, q, scale, rows, K, acts, form):
    """warp_rows for one group of form.lanes lanes: lane l sums the chunks its passes load (l, l + lanes, ... in
    passes of form.chunks), acc[r, p] = the sum over the lanes of scale * (chunk weights . activations) (float64)."""
    C, L, U = K // CHUNK[fmt], form.lanes, form.chunks
    owned = [[c0 + L * u for c0 in range(lane, C, L * U) for u in range(U) if c0 + L * u < C] for lane in range(L)]
    out = np.zeros((len(rows), len(acts)))
    for i, row in enumerate(rows):
        w, s = _row_chunks(fmt, q, scale, row, K)
        for p, a in enumerate(acts):
            per_chunk = s * (w.astype(np.float64) * a.reshape(-1, CHUNK[fmt])).sum(axis=1)
            out[i, p] = sum(per_chunk[c].sum() for c in owned)
    return out


def _plan(ids, E_local, offset, slots):
    """moe_plan: local experts in increasing order, their pairs in a contiguous list."""
    local = ids.reshape(-1) - offset
    counts = np.bincount(local[(local >= 0) & (local < E_local)], minlength=E_local)
    experts = np.flatnonzero(counts)
    slot_expert = np.full(slots, -1)
    slot_expert[: len(experts)] = experts
    starts = np.concatenate(([0], np.cumsum(counts[experts])))
    slot_start = np.concatenate((starts, np.full(slots - len(experts), starts[-1])))
    pair_list = np.concatenate([np.flatnonzero(local == e) for e in experts] or [np.zeros(0, int)])
    return slot_expert, slot_start, pair_list


WARPS, NP = quant.WARPS, quant.EXPERT_PAIRS   # quant.cu: warps per block, pairs of a pass's accumulators


def _random_stack(rng, fmt, E, out, inp):
    """Random codes (no quantization pass), with scales that keep the outputs near 1."""
    if fmt == "int4":
        return Int4Weight(rng.integers(0, 2**32, (E, out, inp // 8), dtype=np.uint32).view(np.int32),
                          rng.uniform(0.5, 1.5, (E, out, inp // 32)).astype(np.float32) / (4.6 * np.sqrt(inp)))
    return Fp8Weight(rng.integers(0, 256, (E, out, inp), dtype=np.uint8) & 0xBF,
                     rng.uniform(0.5, 1.5, (E, out, -(-inp // 128))).astype(np.float32) / np.sqrt(inp))


# (D, I) per format: rows over several passes with idle lanes in the last (INT4 4128: 129 chunks, two a lane and
# pass; FP8 2064: 129 chunks, one), rows of a few chunks (most lanes idle) and of 33 (one lane's chunk in a second
# pass), and outputs that do not fill the last block.
EMULATED = {"int4": [(4128, 96), (64, 1056)], "fp8": [(2064, 48), (64, 528)]}


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.parametrize("case", [0, 1])
def test_grouped_kernel_emulation(fmt, case):
    """moe_q_gate_up / moe_q_down as their blocks and warps index: the rows a warp reads (gate and up of R / 2
    outputs; R down rows), the clamped rows past the end that are read and not stored, the pairs in passes of NP
    (down: of the staged pairs, at T = 2 fewer than an expert's pairs: repeated ids), and the combine's slot order,
    against the numpy reference."""
    rng = np.random.default_rng(1 + case)
    D, I = EMULATED[fmt][case]
    E_local, T, k, offset = 3, (4, 2)[case], 3, 1
    staged = quant.stage_pairs(T)
    gate_up, down = _random_stack(rng, fmt, E_local, 2 * I, D), _random_stack(rng, fmt, E_local, D, I)
    if fmt == "int4":
        gate_up, down = gate_up.tiles(), down.tiles()
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids = rng.integers(0, 5, (T, k)).astype(np.int32)
    ids[:, 0] = offset   # one expert with every token: more pairs than one pass takes
    weights = rng.random((T, k)).astype(np.float32)
    slots = min(E_local, T * k)
    slot_expert, slot_start, pair_list = _plan(ids, E_local, offset, slots)
    (gq, gs), (dq, ds) = (quant._arrays(w) for w in (gate_up, down))
    h = np.full((T * k, I), np.nan, np.float32)
    yk = np.full((T * k, D), np.nan, np.float32)
    gu_p, dn_p = quant.expert_pass(fmt, D), quant.expert_pass(fmt, I)
    for s in range(slots):
        e = slot_expert[s]
        if e < 0:
            continue
        first, last = slot_start[s], slot_start[s + 1]
        O = gu_p.rows // 2   # gate_up: a group reads the gate and up rows of O outputs
        for p0 in range(first, last, NP):
            n = min(NP, last - p0)
            pairs = [pair_list[p0 + min(p, n - 1)] for p in range(NP)]
            for block in range(-(-I // (WARPS * gu_p.warp_rows // 2))):
                for w, g in [(w, g) for w in range(WARPS) for g in range(32 // gu_p.lanes)]:
                    warp = block * WARPS + w
                    if warp * gu_p.warp_rows // 2 >= I:   # whole warps past the end return
                        continue
                    o0 = (warp * (32 // gu_p.lanes) + g) * O
                    outs = [min(o0 + i, I - 1) for i in range(O)]
                    rows = [_stack_row(fmt, e, o, 2 * I) for o in outs] + [_stack_row(fmt, e, I + o, 2 * I)
                                                                             for o in outs]
                    acc = _warp_rows(fmt, gq, gs, rows, D, [x[pr // k] for pr in pairs[:n]], gu_p)
                    for i in range(O):
                        if o0 + i < I:
                            g_, u = acc[i], acc[O + i]
                            h[pairs[:n], o0 + i] = g_ / (1 + np.exp(-g_)) * u
        for p0 in range(first, last, staged):   # passes of the staged pairs
            n = min(staged, last - p0)
            pairs = [pair_list[p0 + min(p, n - 1)] for p in range(NP)]
            for block in range(-(-D // (WARPS * dn_p.warp_rows))):
                for w, g in [(w, g) for w in range(WARPS) for g in range(32 // dn_p.lanes)]:
                    warp = block * WARPS + w
                    if warp * dn_p.warp_rows >= D:
                        continue
                    o0 = (warp * (32 // dn_p.lanes) + g) * dn_p.rows
                    rows = [_stack_row(fmt, e, min(o0 + r, D - 1), D) for r in range(dn_p.rows)]
                    acc = _warp_rows(fmt, dq, ds, rows, I, [h[pr] for pr in pairs[:n]], dn_p)
                    for r in range(dn_p.rows):
                        if o0 + r < D:
                            yk[pairs[:n], o0 + r] = weights.reshape(-1)[pairs[:n]] * acc[r]
    local = (ids - offset >= 0) & (ids - offset < E_local)
    y = np.where(local[..., None], yk.reshape(T, k, D), 0).sum(axis=1)   # a NaN left: a pair's output not written
    np.testing.assert_allclose(y, numpy_quant.moe_experts_quant(x, gate_up, down, ids, weights, offset),
                               rtol=2e-4, atol=2e-4)
