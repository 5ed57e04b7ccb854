"""The kernels on quantized weights (quant.cu) against the numpy references on random inputs (GPU only): the INT4
and FP8 GEMV and its prefill path (transient dequantization + GEMM), and the grouped routed-expert kernels with
expert-parallel offsets, tokens sharing experts, at Kimi-K2's expert width, and under CUDA-graph capture."""
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
    return type(parts[0])(*(np.stack(a) for a in zip(*((p.packed, p.scale) if fmt == "int4" else (p.data, p.scale)
                                                          for p in parts))))


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
        return Int4Weight(packed, exact(scale, BF16))
    data = rng.integers(0, 256, (E, out, inp), dtype=np.uint8) & 0xBF
    return Fp8Weight(data, rng.uniform(0.5, 1.5, (E, out, -(-inp // 128))).astype(np.float32) / np.sqrt(inp))


def _device(w, dtype):
    if isinstance(w, Int4Weight):
        return Int4Weight(cp.asarray(w.packed), cp.asarray(w.scale.astype(dtype)))
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
def test_moe_experts_quant_at_kimi_width(fmt):
    """Kimi-K2's expert shapes (hidden 7168, width 2048): the kernels' long rows and large stack offsets."""
    rng = np.random.default_rng(5)
    E_local, D, I, T, k = 8, 7168, 2048, 3, 4
    gate_up, down = _random_codes(rng, fmt, E_local, 2 * I, D), _random_codes(rng, fmt, E_local, D, I)
    x = exact(rnd(rng, T, D), BF16)
    ids = np.stack([rng.choice(E_local, k, replace=False) for _ in range(T)]).astype(np.int32)
    w = rng.random((T, k)).astype(np.float32)
    want = numpy_quant.moe_experts_quant(x, gate_up, down, ids, w, 0)
    got = quant.moe_experts_quant(dev(x, BF16), _device(gate_up, BF16), _device(down, BF16), cp.asarray(ids),
                                  cp.asarray(w), 0)
    close(got, want, DTYPES["bfloat16"], scale=4)


# (D, I): rows of one 16-byte chunk a lane and pass (u1: all FP8 rows, INT4 rows up to 64 chunks) and two (u2: INT4
# 4128, 129 chunks), over one pass and over several with idle lanes in the last (INT4 4128 and 1056, FP8 2064 and
# 528), outputs that do not fill the last block (test_quant_launch_args emulates the same).
PASS_WIDTHS = [("int4", 4128, 96), ("int4", 64, 1056), ("fp8", 2064, 48), ("fp8", 64, 528)]


@pytest.mark.parametrize("fmt,D,I", PASS_WIDTHS)
@pytest.mark.parametrize("T", [1, 9])
def test_moe_experts_quant_pass_widths(fmt, D, I, T):
    """Each pass width of the expert kernels (quant.expert_pass), with one expert taking every token at T = 9: its
    pairs run in several passes of the weight rows."""
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


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_moe_experts_quant_graph_replay(fmt):
    """Captured once, replayed with other routing: the plan is made on the device, so the replay follows the new ids."""
    rng = np.random.default_rng(11)
    E, D, I, k, T = 16, 128, 64, 8, 4
    gu, dn = _device(_host_weight(rng, fmt, 2 * I, D, stack=E), BF16), _device(_host_weight(rng, fmt, D, I, stack=E), BF16)
    x = dev(exact(rnd(rng, T, D), BF16), BF16)
    ids = cp.asarray(np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32))
    w = cp.asarray(rng.random((T, k)).astype(np.float32))
    quant.moe_experts_quant(x, gu, dn, ids, w, 0)
    stream = cp.cuda.Stream(non_blocking=True)
    with after_inputs(stream):
        stream.begin_capture()
        y = quant.moe_experts_quant(x, gu, dn, ids, w, 0)
        graph = stream.end_capture()
    new_ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    ids[...] = cp.asarray(new_ids)
    cp.cuda.get_current_stream().synchronize()
    graph.launch(stream)
    stream.synchronize()
    want = quant.moe_experts_quant(x, gu, dn, ids, w, 0)
    np.testing.assert_array_equal(host(y), host(want))
