"""The SwiGLU MLP: down(silu(gate(x)) * up(x)), gate and up fused into one weight at load."""
from __future__ import annotations

from dataclasses import dataclass

from ..engine.batch import Array
from ..kernels.registry import Ops
from ..quant import QuantScheme
from .quant_linear import load_linear


@dataclass
class SwiGLU:
    ops: Ops
    gate_up: Array      # [2I, D]: gate rows, then up rows
    down: Array         # [D, I]

    def __call__(self, x: Array) -> Array:
        return self.ops.linear(self.ops.linear_silu_mul(x, self.gate_up), self.down)


def load_swiglu(ops: Ops, backend, weights, prefix: str, scheme: QuantScheme | None = None) -> SwiGLU:
    """{prefix}gate_proj / up_proj / down_proj, the checkpoint names of every line's MLPs, in `scheme`'s formats
    (quantized ones need `ops` to be a quant_linear.QuantOps)."""
    return SwiGLU(ops, load_linear(backend, weights, scheme, prefix + "gate_proj", prefix + "up_proj"),
                  load_linear(backend, weights, scheme, prefix + "down_proj"))


def swiglu_shapes(prefix: str, hidden: int, inter: int, scheme: QuantScheme | None = None
                  ) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes of one SwiGLU MLP under `prefix`."""
    scheme = scheme or QuantScheme()
    return {**scheme.linear_shapes(prefix + "gate_proj", inter, hidden),
            **scheme.linear_shapes(prefix + "up_proj", inter, hidden),
            **scheme.linear_shapes(prefix + "down_proj", hidden, inter)}
