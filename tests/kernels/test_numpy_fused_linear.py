"""The numpy backend's fused linear ops (the reference their CUDA kernels are tested against), checked
against their definitions written out: w = [gate; up] with the gate rows first; residual + linear(x, w),
then RMSNorm of that sum."""
from __future__ import annotations

import numpy as np

from openinfer.kernels import numpy_ops as ref
from openinfer.kernels.registry import KernelRegistry


def test_linear_silu_mul_takes_the_gate_rows_first():
    rng = np.random.default_rng(0)
    x, gate, up = (rng.standard_normal(s).astype(np.float32) for s in ((3, 16), (8, 16), (8, 16)))
    g, u = x @ gate.T, x @ up.T
    got = ref.linear_silu_mul(x, np.concatenate([gate, up]))
    np.testing.assert_allclose(got, g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)


def test_linear_add_rms_norm_returns_the_new_residual():
    rng = np.random.default_rng(1)
    x, w, res = (rng.standard_normal(s).astype(np.float32) for s in ((3, 16), (24, 16), (3, 24)))
    norm_w = (1 + 0.1 * rng.standard_normal(24)).astype(np.float32)
    before = res.copy()
    normed, new_res = ref.linear_add_rms_norm(x, w, res, norm_w, 1e-6)
    h = before + x @ w.T
    np.testing.assert_allclose(new_res, h, rtol=1e-6)
    np.testing.assert_allclose(normed, h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + 1e-6) * norm_w,
                               rtol=1e-5, atol=1e-6)


def test_fused_linear_ops_are_registered_for_numpy():
    reg = KernelRegistry()
    ref.register(reg.register)
    ops = reg.resolve(["linear_silu_mul", "linear_add_rms_norm"], "numpy", "float32")
    assert ops.linear_silu_mul is ref.linear_silu_mul and ops.linear_add_rms_norm is ref.linear_add_rms_norm
