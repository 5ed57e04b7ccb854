"""The kernels on quantized weights (quant.cu) against the numpy references on random inputs (GPU only): the INT4
and FP8 GEMV and its prefill path (transient dequantization + GEMM), and the grouped routed-expert kernels (the GEMV
ones at decode sizes, the tensor-core GEMM at prefill sizes) with expert-parallel offsets, tokens sharing experts,
uneven and empty expert loads, at Kimi-K2's expert width, and under CUDA-graph capture."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from cuda_cases import (  # noqa: F401  (the fixtures are used by name)
    BF16, DTYPES, after_inputs, arrival_counters_left_zero, close, cp, dev, dt, exact, host, own_stream, pdl, rnd)
from openinfer.kernels import numpy_quant
from openinfer.kernels.cuda import quant
from openinfer.quant import Fp8Weight, Int4Weight, quantize_fp8, quantize_int4, row_scales

pytestmark = pytest.mark.cuda


def _host_weight(rng, fmt, out, inp, stack=None):
    """A random quantized weight (or stack) on the host, its INT4 scales rounded to bf16 like a checkpoint's."""
    n = stack or 1
    parts = []
    for _ in range(n):
        w = rng.standard_normal((out, inp)) * inp ** -0.5
        if fmt == "int4":
            parts.append(Int4Weight(*quantize_int4(w, lambda s: exact(s, BF16))))
        else:
            q, s = quantize_fp8(w)
            parts.append(Fp8Weight(q, row_scales(s, out)))
    if stack is None:
        return parts[0]
    stacked = type(parts[0])(*(np.stack(a) for a in zip(*((p.packed, p.scale) if fmt == "int4" else (p.data, p.scale)
                                                            for p in parts))))
    return stacked.tiles() if fmt == "int4" else stacked   # INT4 experts as staged


@functools.lru_cache(maxsize=None)
def _cached_weight(fmt, out, inp):
    """One quantized weight per shape for the linear cases (quantizing 7168 x 2048 on the host takes a while)."""
    return _host_weight(np.random.default_rng(out + inp), fmt, out, inp)


def _random_codes(rng, fmt, E, out, inp):
    """A stack of random codes (no quantization pass: fast at full width), scaled so outputs stay near 1 for
    inputs near 1: INT4 nibbles with bf16 group scales, or finite e4m3 bytes below 2 with float32 row scales."""
    if fmt == "int4":
        packed = rng.integers(0, 2**32, (E, out, inp // 8), dtype=np.uint32).view(np.int32)
        scale = rng.uniform(0.5, 1.5, (E, out, inp // 32)) / (4.6 * np.sqrt(inp))
        return Int4Weight(packed, exact(scale, BF16)).tiles()
    data = rng.integers(0, 256, (E, out, inp), dtype=np.uint8) & 0xBF
    return Fp8Weight(data, rng.uniform(0.5, 1.5, (E, out, -(-inp // 128))).astype(np.float32) / np.sqrt(inp))


def _device(w, dtype):
    if isinstance(w, Int4Weight):
        return Int4Weight(cp.asarray(w.packed), cp.asarray(w.scale.astype(dtype)), w.tiled)
    return Fp8Weight(cp.asarray(w.data), cp.asarray(w.scale.astype(np.float32)))


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16, 40])
@pytest.mark.parametrize("n,k", [(96, 128), (200, 7168), (7168, 2048)])
def test_linear_quant(fmt, m, n, k, dt, pdl):
    rng = np.random.default_rng(m * 1000 + n + k)
    w = _cached_weight(fmt, n, k)
    x = exact(rnd(rng, m, k), dt[0])
    close(quant.linear_quant(dev(x, dt[0]), _device(w, dt[0])), numpy_quant.linear_quant(x, w), dt, scale=2)


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_dequantize(fmt, dt):
    rng = np.random.default_rng(7)
    w = _host_weight(rng, fmt, 130, 256)
    close(quant.dequantize(_device(w, dt[0]), dt[0]), w.dequant(), dt)


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.parametrize("T", [1, 2, 7, 64, 300])
@pytest.mark.parametrize("offset", [0, 4])
def test_moe_experts_quant(fmt, T, offset, dt, pdl, monkeypatch):
    monkeypatch.setattr(quant, "MOE_CHUNK", 128)   # 300 tokens run as three chunks
    rng = np.random.default_rng(T + offset)
    E_local, D, I, k = 12, 256, 96, 4
    gate_up = _host_weight(rng, fmt, 2 * I, D, stack=E_local)
    down = _host_weight(rng, fmt, D, I, stack=E_local)
    x = exact(rnd(rng, T, D), dt[0])
    ids = np.stack([rng.choice(20, k, replace=False) for _ in range(T)]).astype(np.int32)   # some on other ranks
    if T > 2:
        ids[: T // 2, 0] = offset + 3   # many tokens on one expert: several passes over its rows
    w = rng.random((T, k)).astype(np.float32)
    want = numpy_quant.moe_experts_quant(x, gate_up, down, ids, w, offset)
    got = quant.moe_experts_quant(dev(x, dt[0]), _device(gate_up, dt[0]), _device(down, dt[0]), cp.asarray(ids),
                                  cp.asarray(w), offset)
    close(got, want, dt, scale=4)
    shared = exact(rnd(rng, T, D), dt[0])   # the shared experts' output, added by the combine
    got = quant.moe_experts_quant(dev(x, dt[0]), _device(gate_up, dt[0]), _device(down, dt[0]), cp.asarray(ids),
                                  cp.asarray(w), offset, dev(shared, dt[0]))
    close(got, numpy_quant.moe_experts_quant(x, gate_up, down, ids, w, offset, shared), dt, scale=4)


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.parametrize("T,rows", [(3, 0), (32, 32), (128, 128)])
def test_moe_experts_quant_at_kimi_width(fmt, T, rows):
    """Kimi-K2's expert shapes (hidden 7168, width 2048): the kernels' long rows and large stack offsets, on the GEMV
    kernels (3 tokens) and the tensor-core GEMM's 32- and 128-row tiles (112 and 32 k tiles)."""
    rng = np.random.default_rng(5 + T)
    E_local, D, I, k = 8, 7168, 2048, 8 if T > 3 else 4
    gate_up, down = _random_codes(rng, fmt, E_local, 2 * I, D), _random_codes(rng, fmt, E_local, D, I)
    x = exact(rnd(rng, T, D), BF16)
    ids = np.stack([rng.choice(E_local, k, replace=False) for _ in range(T)]).astype(np.int32)
    assert quant.expert_tile_rows(BF16, T, k, E_local, D, I) == rows
    w = rng.random((T, k)).astype(np.float32)
    want = numpy_quant.moe_experts_quant(x, gate_up, down, ids, w, 0)
    got = quant.moe_experts_quant(dev(x, BF16), _device(gate_up, BF16), _device(down, BF16), cp.asarray(ids),
                                  cp.asarray(w), 0)
    close(got, want, DTYPES["bfloat16"], scale=4)


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.parametrize("D,I", [(256, 96), (7168, 2048)])
def test_moe_experts_quant_decode_bits_do_not_follow_the_batch(fmt, D, I):
    """A token's routed-expert output at decode is the same bits alone (every expert pass of one column: quant_mma.cu
    hands the activations between lanes) as batched with tokens that share its experts (passes of several columns),
    and as from a batch that holds it twice."""
    rng = np.random.default_rng(D + I)
    E_local, k, T = 8, 4, 6
    gate_up, down = _random_codes(rng, fmt, E_local, 2 * I, D), _random_codes(rng, fmt, E_local, D, I)
    gu, dn = _device(gate_up, BF16), _device(down, BF16)
    x = dev(exact(rnd(rng, T, D), BF16), BF16)
    ids = np.stack([rng.choice(E_local, k, replace=False) for _ in range(T)]).astype(np.int32)
    ids[1:, :2] = ids[0, :2]   # the other tokens share two of token 0's experts
    w = rng.random((T, k)).astype(np.float32)
    batched = host(quant.moe_experts_quant(x, gu, dn, cp.asarray(ids), cp.asarray(w), 0))
    for t in range(T):
        alone = host(quant.moe_experts_quant(x[t:t + 1], gu, dn, cp.asarray(ids[t:t + 1]), cp.asarray(w[t:t + 1]), 0))
        np.testing.assert_array_equal(alone[0], batched[t])
    twice = host(quant.moe_experts_quant(x[[0, 0]], gu, dn, cp.asarray(ids[[0, 0]]), cp.asarray(w[[0, 0]]), 0))
    np.testing.assert_array_equal(twice, batched[[0, 0]])


# (D, I): each expert kernel form (quant.expert_pass): one 16-byte chunk a lane and pass (FP8 2064) and two (INT4
# 4128, 129 chunks), over several passes with idle lanes in the last; rows of a few chunks (most lanes idle) and of
# 33 (one lane's chunk in a second pass); outputs that do not fill the last block (test_quant_launch_args emulates
# the same).
PASS_WIDTHS = [("int4", 4128, 96), ("int4", 64, 1056), ("fp8", 2064, 48), ("fp8", 64, 528)]


@pytest.mark.parametrize("fmt,D,I", PASS_WIDTHS)
@pytest.mark.parametrize("T", [1, 9])
def test_moe_experts_quant_forms(fmt, D, I, T):
    """Each form of the expert kernels (quant.expert_pass), with one expert taking every token at T = 9: its pairs
    run in several passes of the weight rows."""
    rng = np.random.default_rng(D + I + T)
    E_local, k = 6, 4
    gate_up, down = _random_codes(rng, fmt, E_local, 2 * I, D), _random_codes(rng, fmt, E_local, D, I)
    x = exact(rnd(rng, T, D), BF16)
    ids = rng.integers(0, E_local, (T, k)).astype(np.int32)
    ids[:, 0] = 2
    w = rng.random((T, k)).astype(np.float32)
    want = numpy_quant.moe_experts_quant(x, gate_up, down, ids, w, 0)
    got = quant.moe_experts_quant(dev(x, BF16), _device(gate_up, BF16), _device(down, BF16), cp.asarray(ids),
                                  cp.asarray(w), 0)
    close(got, want, DTYPES["bfloat16"], scale=4)


# (E, D, I, k, T, tile rows): a decode batch on the GEMV kernels, a prefill on the tensor-core GEMM's 128-row tiles
REPLAYS = {"gemv": (16, 128, 64, 8, 4, 0), "mma": (8, 256, 128, 8, 64, 128)}


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.parametrize("path", list(REPLAYS))
def test_moe_experts_quant_graph_replay(fmt, path):
    """Captured once, replayed with other (skewed) routing: the plan / alignment is made on the device, so the replay
    follows the new ids, to the bit of an eager call."""
    rng = np.random.default_rng(11)
    E, D, I, k, T, rows = REPLAYS[path]
    assert quant.expert_tile_rows(BF16, T, k, E, D, I) == rows
    gu = _device(_host_weight(rng, fmt, 2 * I, D, stack=E), BF16)
    dn = _device(_host_weight(rng, fmt, D, I, stack=E), BF16)
    x = dev(exact(rnd(rng, T, D), BF16), BF16)
    ids = cp.asarray(np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32))
    w = cp.asarray(rng.random((T, k)).astype(np.float32))
    quant.moe_experts_quant(x, gu, dn, ids, w, 0)
    stream = cp.cuda.Stream(non_blocking=True)
    with after_inputs(stream):
        stream.begin_capture()
        y = quant.moe_experts_quant(x, gu, dn, ids, w, 0)
        graph = stream.end_capture()
    new_ids = np.minimum(rng.geometric(0.4, (T, k)) - 1, E - 1).astype(np.int32)   # a few experts take most
    ids[...] = cp.asarray(new_ids)
    cp.cuda.get_current_stream().synchronize()
    graph.launch(stream)
    stream.synchronize()
    want = quant.moe_experts_quant(x, gu, dn, ids, w, 0)
    np.testing.assert_array_equal(host(y), host(want))


# (T, local experts, top-k, offset, tile rows): 32-row tiles with one expert in every token (its pairs over several
# tiles, the last ragged); 128-row tiles over an expert-parallel shard (a third of the pairs on other ranks); 128-row
# tiles with five of eight experts left empty. D 512 and I 192: eight and three k tiles (the three-stage pipeline's
# refills and its short end), six gate_up column tiles.
MMA_CASES = {"m2_uneven": (48, 8, 4, 0, 32), "m8_shard": (300, 8, 4, 4, 128), "m8_empty_experts": (160, 8, 4, 0, 128)}


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.parametrize("case", list(MMA_CASES))
def test_moe_experts_quant_mma(fmt, case, pdl):
    """The tensor-core expert path (quant.expert_tile_rows picks it) against the numpy reference, with and without
    the shared experts' addend."""
    T, E_local, k, offset, rows = MMA_CASES[case]
    D, I = 512, 192
    rng = np.random.default_rng(T + E_local + len(fmt))
    gate_up = _host_weight(rng, fmt, 2 * I, D, stack=E_local)
    down = _host_weight(rng, fmt, D, I, stack=E_local)
    x = exact(rnd(rng, T, D), BF16)
    if case == "m8_empty_experts":
        ids = np.stack([rng.choice(3, 3, replace=False) for _ in range(T)]).astype(np.int32)
        ids = np.concatenate([ids, ids[:, :1] + 10], axis=1)   # the fourth slot on another rank
    else:
        ids = np.stack([rng.choice(E_local + 4, k, replace=False) for _ in range(T)]).astype(np.int32)
        if case == "m2_uneven":
            ids[:, 0] = offset + 3
    assert quant.expert_tile_rows(BF16, T, k, E_local, D, I) == rows
    w = rng.random((T, k)).astype(np.float32)
    args = (_device(gate_up, BF16), _device(down, BF16), cp.asarray(ids), cp.asarray(w), offset)
    close(quant.moe_experts_quant(dev(x, BF16), *args), numpy_quant.moe_experts_quant(x, gate_up, down, ids, w, offset),
          DTYPES["bfloat16"], scale=4)
    shared = exact(rnd(rng, T, D), BF16)
    close(quant.moe_experts_quant(dev(x, BF16), *args, dev(shared, BF16)),
          numpy_quant.moe_experts_quant(x, gate_up, down, ids, w, offset, shared), DTYPES["bfloat16"], scale=4)
