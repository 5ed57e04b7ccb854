"""The numpy backend's fused linear op (the reference its CUDA kernel is tested against), checked against
its definition written out: w = [gate; up] with the gate rows first."""
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


def test_fused_linear_op_is_registered_for_numpy():
    reg = KernelRegistry()
    ref.register(reg.register)
    assert reg.resolve(["linear_silu_mul"], "numpy", "float32").linear_silu_mul is ref.linear_silu_mul
