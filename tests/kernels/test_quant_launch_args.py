"""CPU checks of the quantized-weight kernels (quant.cu): every launch's arguments against the compiled parameter
lists (no GPU), and a numpy emulation of the kernels' own indexing (the FP8 bit decoding, the expert plan, the
per-slot passes, the combine order) against the numpy references."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cupy")
from openinfer.kernels import numpy_quant  # noqa: E402
from openinfer.kernels.cuda import module, moe, quant  # noqa: E402
from openinfer.quant import Fp8Weight, Int4Weight, e4m3_to_f32, quantize_fp8, quantize_int4, row_scales  # noqa: E402
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
    sfx = module.suffix(dtype)   # rows of 256 and 64 weights: one chunk a lane and pass (u1), four rows a warp
    assert names == ["moe_plan", f"moe_q_gate_up_{fmt}_{sfx}_u1", f"moe_q_down_{fmt}_{sfx}_u1", f"moe_combine_{sfx}"]
    assert launches[1].grid == (4, 6) and launches[2].grid == (8, 6)   # slots: min(E_local, T * k)
    launches.clear()
    quant.MOE_CHUNK, chunk = 2, quant.MOE_CHUNK
    try:   # 5 tokens in chunks of 2: three passes of the four launches, the last over one token
        quant.moe_experts_quant(fake(np.zeros((5, 256)), dtype), gu, dn, fake(np.zeros((5, 4), np.int32)),
                                fake(np.ones((5, 4), np.float32)), 0)
    finally:
        quant.MOE_CHUNK = chunk
    assert [c.name for c in launches] == names * 3 and launches[-1].grid == (1,)


# Kimi-K2's experts (hidden 7168, width 2048): (gate_up kernel, grid x), (down kernel, grid x). A lane keeps eight
# 16-byte loads in flight: INT4 gate_up 224 chunks a row as 4 a pass over 2 rows (one output), down 64 chunks as 2
# over 4 rows; FP8 448 and 128 chunks, 4 a pass over 2 rows.
KIMI_GRIDS = {"int4": (("u4", 2048 // 8), ("u2", 7168 // 32)), "fp8": (("u4", 2048 // 8), ("u4", 7168 // 16))}


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_kimi_expert_launches(launches, fmt):
    D, I, E, k, T = 7168, 2048, 3, 8, 1   # three experts: the grid's x depends only on the shape
    if fmt == "int4":
        gu = Int4Weight(fake(np.zeros((E, 2 * I, D // 8), np.int32)), fake(np.zeros((E, 2 * I, D // 32)), BF16))
        dn = Int4Weight(fake(np.zeros((E, D, I // 8), np.int32)), fake(np.zeros((E, D, I // 32)), BF16))
    else:
        gu = Fp8Weight(fake(np.zeros((E, 2 * I, D), np.uint8)), fake(np.zeros((E, 2 * I, D // 128), np.float32)))
        dn = Fp8Weight(fake(np.zeros((E, D, I), np.uint8)), fake(np.zeros((E, D, I // 128), np.float32)))
    quant.moe_experts_quant(fake(np.zeros((T, D)), BF16), gu, dn, fake(np.zeros((T, k), np.int32)),
                            fake(np.ones((T, k), np.float32)), 0)
    (gu_u, gu_x), (dn_u, dn_x) = KIMI_GRIDS[fmt]
    slots = min(E, T * k)   # fixed by the token count: the launches can be captured per batch size
    assert [(c.name, c.grid, c.block) for c in launches[1:3]] == [
        (f"moe_q_gate_up_{fmt}_bf16_{gu_u}", (gu_x, slots), 256), (f"moe_q_down_{fmt}_bf16_{dn_u}", (dn_x, slots), 256)]


def test_quant_refuses_misshapen_weights(launches):
    w = _weights("int4", 8, 64, 1, BF16)
    with pytest.raises(TypeError, match="INT4 scales"):
        quant.linear_quant(fake(np.zeros((1, 64)), np.float32), Int4Weight(w.packed[0], w.scale[0]))
    words = fake(np.zeros(8 * 8 + 1, np.int32))[1:].reshape(8, 8)   # 4 bytes past an aligned start
    with pytest.raises(ValueError, match="16-byte aligned"):
        quant.linear_quant(fake(np.zeros((1, 64)), BF16), Int4Weight(words, w.scale[0]))


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_quant_reads_aligned_rows(launches, fmt):
    """A contiguous row that starts off a 16-byte boundary (one token's column slice) reaches the kernels as an
    aligned copy: they read the activations as 16-byte words."""
    x = fake(np.arange(264, dtype=np.float32).reshape(1, 264), BF16)[:, 4:260]   # 8 bytes past an aligned start
    assert x.flags.c_contiguous and x.data.ptr % 16 == 8
    lin = _weights(fmt, 96, 256, 1, BF16)
    lin = type(lin)(*(a[0] for a in vars(lin).values()))
    quant.linear_quant(x, lin)
    gu, dn = _weights(fmt, 2 * 64, 256, 6, BF16), _weights(fmt, 256, 64, 6, BF16)
    quant.moe_experts_quant(x, gu, dn, fake(np.zeros((1, 4), np.int32)), fake(np.ones((1, 4), np.float32)), 0)
    for call in (launches[0], launches[2]):   # q_gemv, moe_q_gate_up: x is their first argument
        assert call.args[0].data.ptr % 16 == 0 and np.array_equal(call.args[0], x), call.name


# ---- emulation: quant.cu's arithmetic and indexing in numpy ----

def _e4m3_bits(b: np.ndarray) -> np.ndarray:
    """Fp8::e4m3: exponent and mantissa moved into place (bias 7 -> 127), subnormals m * 2^-9."""
    mag = (b & 0x7F).astype(np.uint32)
    normal = ((mag << 20) + 0x3C000000).view(np.float32)
    v = np.where(mag >> 3, normal, mag.astype(np.float32) * np.float32(0.001953125))
    return np.where(b & 0x80, -v, v)


def test_fp8_bit_decoding_matches_the_table():
    b = np.arange(256, dtype=np.uint32)
    finite = (b & 0x7F) != 0x7F
    np.testing.assert_array_equal(_e4m3_bits(b)[finite], e4m3_to_f32(b.astype(np.uint8))[finite])


WORDS = {"int4": 4, "fp8": 1}   # quant.cu's F::WORDS: 8-weight words a lane loads at once


def _load8(fmt, q, scale, row, K, w):
    """Word w of weight row `row` as the kernels read it, on flat arrays: F::load of chunk c = w // WORDS (INT4: 16
    bytes at chunk index row * K/32 + c, its scale at the same index; FP8: the 8 bytes of word c), then F::expand of
    word w % WORDS of it."""
    c, j = divmod(w, WORDS[fmt])
    if fmt == "int4":
        chunk = q.reshape(-1).view(np.uint32).reshape(-1, 4)[row * (K // 32) + c]
        s = scale.reshape(-1)[row * (K // 32) + c]
        return np.array([(int(chunk[j] >> (4 * i)) & 15) - 8 for i in range(8)], np.float32) * s
    raw = q.reshape(-1)[row * K + 8 * c: row * K + 8 * c + 8].astype(np.uint32)
    return _e4m3_bits(raw) * scale.reshape(-1)[row * -(-K // 128) + c // 16]


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


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_grouped_kernel_emulation(fmt):
    rng = np.random.default_rng(1)
    E_local, D, I, T, k, offset = 5, 64, 32, 6, 3, 1
    make = (lambda m: Int4Weight(*quantize_int4(m))) if fmt == "int4" else \
        (lambda m: Fp8Weight(quantize_fp8(m)[0], row_scales(quantize_fp8(m)[1], m.shape[0])))
    gus = [make(rng.standard_normal((2 * I, D))) for _ in range(E_local)]
    dns = [make(rng.standard_normal((D, I))) for _ in range(E_local)]
    stack = (lambda ws: type(ws[0])(*(np.stack(p) for p in zip(*(vars(w).values() for w in ws)))))
    gate_up, down = stack(gus), stack(dns)
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids = rng.integers(0, 8, (T, k)).astype(np.int32)
    weights = rng.random((T, k)).astype(np.float32)
    slots = min(E_local, T * k)
    slot_expert, slot_start, pair_list = _plan(ids, E_local, offset, slots)
    gq, gs = vars(gate_up).values()
    dq, ds = vars(down).values()
    h = np.zeros((T * k, I), np.float32)
    yk = np.zeros((T * k, D), np.float32)
    for s in range(slots):
        e = slot_expert[s]
        if e < 0:
            continue
        for pair in pair_list[slot_start[s]: slot_start[s + 1]]:
            t = pair // k
            for o in range(I):
                g = sum(_load8(fmt, gq, gs, e * 2 * I + o, D, w) @ x[t, 8 * w: 8 * w + 8] for w in range(D // 8))
                u = sum(_load8(fmt, gq, gs, e * 2 * I + I + o, D, w) @ x[t, 8 * w: 8 * w + 8] for w in range(D // 8))
                h[pair, o] = g / (1 + np.exp(-g)) * u
            for o in range(D):
                yk[pair, o] = weights.reshape(-1)[pair] * sum(
                    _load8(fmt, dq, ds, e * D + o, I, w) @ h[pair, 8 * w: 8 * w + 8] for w in range(I // 8))
    local = (ids - offset >= 0) & (ids - offset < E_local)
    y = (yk.reshape(T, k, D) * local[..., None]).sum(axis=1)
    np.testing.assert_allclose(y, numpy_quant.moe_experts_quant(x, gate_up, down, ids, weights, offset),
                               rtol=1e-4, atol=1e-4)
