"""Linears stored in the checkpoint's format (dense, INT4 pack-quantized or FP8 block-scaled; openinfer.quant),
and an op table that dispatches on it, so the shared layers (MLA, SwiGLU, MoE) run unchanged on quantized
weights: `linear`, `linear_silu_mul` and `moe_experts` pick the op of their weight's format.
"""
from __future__ import annotations

from typing import Any

from ..kernels.registry import Ops
from ..quant import Fp8Weight, Int4Weight, QuantScheme
from ..quant.scheme import DENSE, FP8, INT4, host_linear
from ..quant.staging import fuse_rows, stack_to_backend, to_backend

_SUFFIX = {Int4Weight: "int4", Fp8Weight: "fp8"}


def quant_ops_needed(scheme: QuantScheme, has_moe: bool) -> list[str]:
    """The ops a model in `scheme` calls beyond the dense ones (its kernel plan's share)."""
    if scheme.method == DENSE:
        return []
    fmt = {INT4: "int4", FP8: "fp8"}[scheme.method]
    return [f"linear_{fmt}", "silu_mul"] + ([f"moe_experts_{fmt}"] if has_moe else [])


class QuantOps:
    """`ops` with linear, linear_silu_mul and moe_experts dispatching on the weight's format; every other op is
    `ops`'s own."""

    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def _op(self, base: str, w: Any) -> Any:
        fmt = _SUFFIX.get(type(w))
        return getattr(self._ops, base if fmt is None else f"{base}_{fmt}")

    def linear(self, x: Any, w: Any) -> Any:
        return self._op("linear", w)(x, w)

    def linear_silu_mul(self, x: Any, w: Any) -> Any:
        if type(w) in _SUFFIX:
            return self._ops.silu_mul(self.linear(x, w))
        return self._ops.linear_silu_mul(x, w)

    def moe_experts(self, x: Any, gate_up: Any, down: Any, ids: Any, weights: Any, expert_offset: int,
                    addend: Any = None) -> Any:
        return self._op("moe_experts", gate_up)(x, gate_up, down, ids, weights, expert_offset, addend)


def load_linear(backend: Any, weights: Any, scheme: QuantScheme | None, *modules: str) -> Any:
    """Linears `modules` (names without ".weight") fused along their output rows, on the device in their format.
    Dense ones take the backend's streaming load."""
    if scheme is None or all(scheme.format_of(m) == DENSE for m in modules):
        return backend.load(weights, *(m + ".weight" for m in modules))
    return to_backend(backend, fuse_rows([host_linear(weights, scheme, m) for m in modules]))


def load_fused(backend: Any, weights: Any, scheme: QuantScheme | None, *modules: str) -> list[Any]:
    """Linears `modules` of one input as [one Linear fused along the output rows] (one GEMM), or each apart where
    the scheme stores them in different formats (a fused weight has one)."""
    if scheme is not None and len({scheme.format_of(m) for m in modules}) > 1:
        return [load_linear(backend, weights, scheme, m) for m in modules]
    return [load_linear(backend, weights, scheme, *modules)]


def load_expert_stack(backend: Any, weights: Any, scheme: QuantScheme, experts: list[tuple[str, ...]]) -> Any:
    """One quantized stack [E, ...] of experts' Linears, each expert's `modules` fused (gate then up)."""
    return stack_to_backend(backend, (fuse_rows([host_linear(weights, scheme, m) for m in ms]) for ms in experts),
                            len(experts))
