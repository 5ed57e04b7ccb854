"""Quantized weight formats: INT4 pack-quantized and FP8 block-scaled layouts, their dequantization against
torch / ml_dtypes, safetensors reading, the config scheme, and the numpy ops on quantized weights."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.loading.config import ConfigError
from openinfer.kernels import numpy_quant
from openinfer.quant import (Fp8Weight, Int4Weight, QuantizedTensorError, e4m3_to_f32, pack_int4, quant_scheme,
                             quantize_fp8, quantize_int4, row_scales, unpack_int4)
from openinfer.quant.scheme import host_linear
from openinfer.quant.staging import fuse_rows, stack_to_backend, to_backend
from openinfer.loading.weights import Checkpoint

KIMI_INT4 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
             "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                           "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                       "strategy": "group", "group_size": 32, "dynamic": False}}},
             "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*"]}
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def test_int4_packing_convention():
    # element 8j + i is nibble i (bits 4i..4i+3) of word j, stored as q + 8
    q = np.arange(-8, 8).reshape(1, 16)
    packed = pack_int4(q)
    words = [sum((v + 8) << (4 * i) for i, v in enumerate(q[0, 8 * j: 8 * j + 8])) for j in range(2)]
    assert packed.dtype == np.int32 and packed.shape == (1, 2)
    assert packed.view(np.uint32).tolist() == [[w & 0xFFFFFFFF for w in words]]
    np.testing.assert_array_equal(unpack_int4(packed), q)
    rng = np.random.default_rng(0)
    q = rng.integers(-8, 8, (5, 3, 64))
    np.testing.assert_array_equal(unpack_int4(pack_int4(q)), q)


def test_int4_quantize_dequant():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 96)).astype(np.float32)
    packed, scale = quantize_int4(w)
    deq = Int4Weight(packed, scale).dequant()
    assert deq.shape == (6, 96)
    err = np.abs(deq - w).reshape(6, 3, 32).max(-1)
    assert np.all(err <= scale * 0.5 + 1e-6)   # round to nearest within each group's step
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_int4(w[:, :40])


def test_e4m3_table_matches_torch():
    torch = pytest.importorskip("torch")
    raw = np.arange(256, dtype=np.uint8)
    ref = torch.from_numpy(raw.copy()).view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(e4m3_to_f32(raw), ref)   # NaN == NaN in assert_array_equal


def test_fp8_quantize_matches_torch_rounding():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    w = rng.standard_normal((200, 300)).astype(np.float32)
    data, scale_inv = quantize_fp8(w)
    assert scale_inv.shape == (2, 3)
    full = np.repeat(row_scales(scale_inv, 200), 128, axis=-1)[:, :300]
    ref = torch.from_numpy(w / full).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(data, ref)
    deq = Fp8Weight(data, row_scales(scale_inv, 200)).dequant()
    np.testing.assert_allclose(deq, w, rtol=0.07, atol=1e-3 * np.abs(w).max())


def _write(path, tensors):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return torch


def test_checkpoint_reads_int4_and_fp8(tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    w4 = rng.standard_normal((64, 128)).astype(np.float32)
    packed, scale = quantize_int4(w4, lambda s: torch.from_numpy(s).bfloat16().float().numpy())
    w8 = rng.standard_normal((130, 256)).astype(np.float32)
    data, scale_inv = quantize_fp8(w8)
    _write(tmp_path / "model.safetensors", {
        "a.weight_packed": torch.from_numpy(packed), "a.weight_scale": torch.from_numpy(scale).bfloat16(),
        "a.weight_shape": torch.tensor([64, 128]),
        "b.weight": torch.from_numpy(data).view(torch.float8_e4m3fn), "b.weight_scale_inv": torch.from_numpy(scale_inv),
        "c.weight": torch.from_numpy(w4).bfloat16()})
    ck = Checkpoint(tmp_path)
    int4 = quant_scheme({"quantization_config": KIMI_INT4 | {"ignore": ["c"]}})
    a = host_linear(ck, int4, "a")
    ref = (torch.from_numpy(unpack_int4(packed)).float() * torch.from_numpy(scale).bfloat16().float()
           .repeat_interleave(32, dim=1)).numpy()
    np.testing.assert_array_equal(a.dequant(), ref)
    assert isinstance(host_linear(ck, int4, "c"), np.ndarray)
    b = host_linear(ck, quant_scheme({"quantization_config": FP8}), "b")
    ref8 = (torch.from_numpy(data).view(torch.float8_e4m3fn).float()
            * torch.from_numpy(scale_inv).repeat_interleave(128, 0)[:130].repeat_interleave(128, 1)[:, :256]).numpy()
    np.testing.assert_array_equal(b.dequant(), ref8)
    # a tensor stored in a format the scheme cannot serve fails naming it
    with pytest.raises(QuantizedTensorError, match="tensor c.weight is stored as BF16.*F8_E4M3"):
        host_linear(ck, quant_scheme({"quantization_config": FP8}), "c")


def test_scheme_formats_and_shapes():
    s = quant_scheme({"quantization_config": KIMI_INT4})
    assert s.format_of("model.layers.1.mlp.experts.5.up_proj") == "int4"
    for dense in ("model.layers.1.self_attn.q_a_proj", "model.layers.1.mlp.shared_experts.up_proj",
                  "model.layers.0.mlp.gate_proj", "lm_head"):
        assert s.format_of(dense) == "dense", dense
    assert s.linear_shapes("x", 64, 128) == {"x.weight_packed": (64, 16), "x.weight_scale": (64, 4),
                                             "x.weight_shape": (2,)}
    f = quant_scheme({"quantization_config": FP8})
    assert f.format_of("model.layers.0.self_attn.kv_b_proj") == "fp8" and f.format_of("lm_head") == "dense"
    assert f.linear_shapes("x", 130, 256) == {"x.weight": (130, 256), "x.weight_scale_inv": (2, 2)}
    assert quant_scheme({}).format_of("x") == "dense"


@pytest.mark.parametrize("change,field", [
    ({"quant_method": "awq"}, "quant_method"),
    ({"format": "int-quantized"}, "format"),
    ({"config_groups": {"g": {"weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "group",
                                          "group_size": 32}}}}, "num_bits"),
    ({"config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                                          "group_size": 32}}}}, "symmetric"),
    ({"config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                          "group_size": 128}}}}, "group_size"),
])
def test_scheme_refuses_unserved_int4(change, field):
    with pytest.raises(ConfigError, match=field):
        quant_scheme({"quantization_config": KIMI_INT4 | change})


def test_scheme_refuses_unserved_fp8():
    with pytest.raises(ConfigError, match="weight_block_size"):
        quant_scheme({"quantization_config": FP8 | {"weight_block_size": [1, 128]}})


def _experts(rng, E, I, D, fmt):
    ws = []
    for _ in range(E):
        gu, dn = rng.standard_normal((2 * I, D)) * 0.2, rng.standard_normal((D, I)) * 0.2
        if fmt == "int4":
            ws.append((Int4Weight(*quantize_int4(gu)), Int4Weight(*quantize_int4(dn))))
        else:
            ws.append(tuple(Fp8Weight(q, row_scales(s, m.shape[0])) for m in (gu, dn) for q, s in [quantize_fp8(m)]))
    return ws


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_moe_experts_quant_matches_dense_experts(fmt):
    from openinfer.backends.numpy_backend import NumpyBackend
    rng = np.random.default_rng(4)
    E, I, D, T, k = 6, 32, 64, 5, 3
    experts = _experts(rng, E, I, D, fmt)
    be = NumpyBackend()
    gate_up = stack_to_backend(be, (g for g, _ in experts), len(experts))
    down = stack_to_backend(be, (d for _, d in experts), len(experts))
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids = rng.integers(0, 8, (T, k)).astype(np.int32)   # ids 6, 7 lie on another rank
    w = rng.random((T, k)).astype(np.float32)
    want = np.zeros((T, D))
    for t in range(T):
        for j in range(k):
            if ids[t, j] - 2 in range(E):
                g, d = experts[ids[t, j] - 2]
                h = g.dequant() @ x[t]
                want[t] += w[t, j] * (d.dequant() @ (h[:I] / (1 + np.exp(-h[:I])) * h[I:]))
    got = numpy_quant.moe_experts_quant(x, gate_up, down, ids, w, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    shared = rng.standard_normal((T, D)).astype(np.float32)   # the shared experts' output as the addend
    np.testing.assert_allclose(numpy_quant.moe_experts_quant(x, gate_up, down, ids, w, 2, shared), got + shared,
                               rtol=1e-6, atol=1e-6)
    lin = numpy_quant.linear_quant(x, to_backend(be, experts[0][0]))
    np.testing.assert_allclose(lin, x @ experts[0][0].dequant().T, rtol=1e-6, atol=1e-6)


def test_fuse_rows_keeps_each_part():
    rng = np.random.default_rng(5)
    a, b = (Int4Weight(*quantize_int4(rng.standard_normal((r, 64)))) for r in (32, 16))
    f = fuse_rows([a, b])
    np.testing.assert_array_equal(f.dequant(), np.concatenate([a.dequant(), b.dequant()]))
    with pytest.raises(ValueError, match="different formats"):
        fuse_rows([a, np.zeros((4, 64), np.float32)])


def test_stack_takes_experts_one_at_a_time():
    """The stack is built from experts as they are yielded (a generator: the host holds one at a time); a format
    change or a count that does not match is refused."""
    from openinfer.backends.numpy_backend import NumpyBackend
    rng = np.random.default_rng(6)
    ws = [Int4Weight(*quantize_int4(rng.standard_normal((16, 64)))) for _ in range(3)]
    stack = stack_to_backend(NumpyBackend(), iter(ws), 3)   # INT4 experts staged tiled
    assert stack.tiled and stack.shape == (3, 16, 64)
    np.testing.assert_array_equal(stack.packed, np.stack([w.tiles().packed for w in ws]))
    np.testing.assert_array_equal(stack.dequant(1), ws[1].dequant())
    with pytest.raises(ValueError, match="different formats"):
        stack_to_backend(NumpyBackend(), iter([ws[0], np.zeros((16, 64), np.float32)]), 2)
    with pytest.raises(ValueError, match="2 experts given for a stack of 3"):
        stack_to_backend(NumpyBackend(), iter(ws[:2]), 3)


def test_load_fused_keeps_only_mixed_formats_apart(tmp_path):
    """Projections of one input load as one fused Linear in their common format, and each apart where the scheme
    keeps one of them dense (a fused weight has one format)."""
    torch = pytest.importorskip("torch")
    from openinfer.backends.numpy_backend import NumpyBackend
    from openinfer.layers.quant_linear import load_fused
    rng = np.random.default_rng(6)
    tensors, want = {}, {}
    for name, rows in (("q", 256), ("kv", 64)):
        w = rng.standard_normal((rows, 128)).astype(np.float32)
        data, scale_inv = quantize_fp8(w)
        tensors[f"{name}.weight"] = torch.from_numpy(data).view(torch.float8_e4m3fn)
        tensors[f"{name}.weight_scale_inv"] = torch.from_numpy(scale_inv)
        want[name] = Fp8Weight(data, row_scales(scale_inv, rows)).dequant()
    tensors["d.weight"] = torch.from_numpy(want["kv"]).bfloat16()
    _write(tmp_path / "model.safetensors", tensors)
    ck, be = Checkpoint(tmp_path), NumpyBackend()
    [fused] = load_fused(be, ck, quant_scheme({"quantization_config": FP8}), "q", "kv")
    np.testing.assert_array_equal(fused.dequant(), np.concatenate([want["q"], want["kv"]]))
    q, d = load_fused(be, ck, quant_scheme({"quantization_config": FP8 | {"modules_to_not_convert": ["d"]}}), "q", "d")
    assert isinstance(q, Fp8Weight) and isinstance(d, np.ndarray)
    np.testing.assert_array_equal(q.dequant(), want["q"])
    np.testing.assert_allclose(d, want["kv"], rtol=1e-2)
