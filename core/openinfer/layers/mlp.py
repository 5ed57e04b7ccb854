"""The SwiGLU MLP: down(silu(gate(x)) * up(x)), gate and up fused into one weight at load."""
from __future__ import annotations

from dataclasses import dataclass

from ..batch import Array
from ..kernels.registry import Ops


@dataclass
class SwiGLU:
    ops: Ops
    gate_up: Array      # [2I, D]: gate rows, then up rows
    down: Array         # [D, I]

    def __call__(self, x: Array) -> Array:
        return self.ops.linear(self.ops.linear_silu_mul(x, self.gate_up), self.down)


def load_swiglu(ops: Ops, backend, weights, prefix: str) -> SwiGLU:
    """{prefix}gate_proj / up_proj / down_proj.weight, the checkpoint names of every line's MLPs."""
    return SwiGLU(ops, backend.load(weights, prefix + "gate_proj.weight", prefix + "up_proj.weight"),
                  backend.load(weights, prefix + "down_proj.weight"))
