"""numpy references of the ops on quantized weights (float32 compute): the CPU backend and the specification of
the CUDA kernels in cuda/quant.py.

`linear_int4` / `linear_fp8` are `linear` with an Int4Weight / Fp8Weight; `moe_experts_int4` / `moe_experts_fp8`
are `moe_experts` (the routed experts of one MoE layer, see layers/moe.py) with stacks of them:
gate_up [E_local, 2I, D] (gate rows first), down [E_local, D, I]; y[t] = sum over k of weights[t, k] *
down_e(silu(gate_e x[t]) * up_e x[t]) for the experts e = ids[t, k] in [expert_offset, expert_offset + E_local);
the others contribute nothing (expert parallelism: another rank holds them); an optional `addend` [T, D] (the
shared experts' output) is added to that sum in float32.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .numpy_mla_moe import with_addend


def linear_quant(x: np.ndarray, w: Any) -> np.ndarray:
    """x [T, in] @ W.T with W dequantized ([out, in])."""
    return x @ w.dequant().T


def moe_experts_quant(x: np.ndarray, gate_up: Any, down: Any, ids: np.ndarray, weights: np.ndarray,
                      expert_offset: int, addend: np.ndarray | None = None) -> np.ndarray:
    """The routed experts on quantized stacks, each selected expert dequantized once per call."""
    T, D = x.shape
    y = np.zeros((T, D), np.float32)
    ids = np.asarray(ids)
    local = ids - expert_offset
    for e in np.unique(local[(local >= 0) & (local < gate_up.shape[0])]):
        rows, slots = np.nonzero(local == e)
        h = x[rows] @ gate_up.dequant(int(e)).T
        g, u = np.split(h, 2, axis=-1)
        out = (g / (1.0 + np.exp(-g)) * u) @ down.dequant(int(e)).T
        np.add.at(y, rows, out * np.asarray(weights, np.float32)[rows, slots][:, None])
    return with_addend(y, addend)


def register(register_kernel) -> None:
    """Registers the quantized ops for the numpy backend (called through the core's own hookimpl)."""
    for name, fn in (("linear_int4", linear_quant), ("linear_fp8", linear_quant),
                     ("moe_experts_int4", moe_experts_quant), ("moe_experts_fp8", moe_experts_quant)):
        register_kernel(name, "numpy", fn, dtypes=("float32",))
