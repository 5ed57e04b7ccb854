"""DeepSeekMoE: a float32 router picks the top-k of E routed experts per token, their SwiGLU outputs are
summed with the router's weights, and shared experts (a plain dense MLP) are added. Written against the op
registry (moe_router: router_logits then moe_route as one op; moe_experts), so it runs on every backend. The shared
experts run `beside` the router and the routed experts (on CUDA a side stream: at decode batches each of these
kernels leaves most of the GPU idle) and moe_experts takes their output as its `addend`, added to the routed sum in
float32 before the one rounding to the model dtype (on CUDA inside the combine kernel, which joins the side stream,
so the add costs no launch of its own).

Expert weights stay stacked, gate_up [E_local, 2I, D] (gate rows first) and down [E_local, D, I], for
grouped kernels. Expert parallelism: a rank holds experts [expert_offset, expert_offset + E_local) and
computes only their share; `comm.all_reduce` (a sum over ranks) completes the routed output before the
replicated shared experts are added (there, after the all-reduce, not as the addend: every rank holds them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..engine.batch import Array
from ..loading.config import ConfigError
from ..kernels.registry import Ops
from ..parallel.communicator import Communicator
from ..quant import QuantScheme
from ..quant.scheme import DENSE
from .mlp import SwiGLU, load_swiglu, swiglu_shapes
from .quant_linear import load_expert_stack

SCORINGS = ("softmax", "sigmoid")
METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
OPS = ("moe_router", "moe_experts", "beside")   # what MoE calls: a kernel plan with MoE layers names them


@dataclass(frozen=True)
class RouterConfig:
    """How a token's experts and their weights are chosen (kernels/numpy_mla_moe.py: moe_route)."""
    top_k: int
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    method: Literal["greedy", "group_limited_greedy", "noaux_tc"] = "greedy"
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0

    def check(self, num_experts: int) -> None:
        """Raise ConfigError naming the config.json field that does not fit."""
        if self.scoring not in SCORINGS:
            raise ConfigError(f"scoring_func {self.scoring!r} is not supported ({', '.join(SCORINGS)})")
        if self.method not in METHODS:
            raise ConfigError(f"topk_method {self.method!r} is not supported ({', '.join(METHODS)})")
        if not 1 <= self.top_k <= num_experts:
            raise ConfigError(f"num_experts_per_tok {self.top_k} must lie in 1 .. n_routed_experts ({num_experts})")
        if self.n_group < 1 or num_experts % self.n_group:
            raise ConfigError(f"n_group {self.n_group} must divide n_routed_experts {num_experts}")
        if not 1 <= self.topk_group <= self.n_group:
            raise ConfigError(f"topk_group {self.topk_group} must lie in 1 .. n_group ({self.n_group})")
        if self.method != "greedy" and self.topk_group * (num_experts // self.n_group) < self.top_k:
            raise ConfigError(f"topk_group {self.topk_group} groups of {num_experts // self.n_group} experts cannot "
                             f"hold num_experts_per_tok {self.top_k}")
        if self.method == "noaux_tc" and self.n_group > 1 and num_experts // self.n_group < 2:
            raise ConfigError("noaux_tc scores a group by its two best experts: n_group leaves fewer per group")


@dataclass
class MoEWeights:
    gate: Array               # [E, D] float32 router
    bias: Array | None        # [E] float32 e_score_correction_bias (noaux_tc), else None
    gate_up: Array            # [E_local, 2I, D]: this rank's experts, gate rows then up rows
    down: Array               # [E_local, D, I]
    shared: SwiGLU | None     # the shared experts as one MLP (intermediate n_shared * I), or None


class MoE:
    def __init__(self, ops: Ops, router: RouterConfig, w: MoEWeights, expert_offset: int = 0,
                 comm: Communicator | None = None) -> None:
        self.ops, self.router, self.w = ops, router, w
        self.expert_offset, self.comm = expert_offset, comm

    def __call__(self, x: Array) -> Array:
        ops, w = self.ops, self.w
        # the shared experts beside the router and the routed experts (a side stream on CUDA), joined by the combine
        # that adds them; under expert parallelism they are added after the all-reduce
        shared = None if w.shared is None else ops.beside(w.shared, x) if self.comm is None else w.shared(x)
        ids, weights = ops.moe_router(x, w.gate, w.bias, self.router)
        if self.comm is None:
            return ops.moe_experts(x, w.gate_up, w.down, ids, weights, self.expert_offset, shared)
        y = self.comm.all_reduce(ops.moe_experts(x, w.gate_up, w.down, ids, weights, self.expert_offset))
        return y if shared is None else y + shared


def moe_weight_shapes(prefix: str, hidden: int, num_experts: int, expert_inter: int, shared_inter: int,
                      bias: bool, scheme: QuantScheme | None = None) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes of one DeepSeek-layout MoE block under `prefix` (e.g. "model.layers.3.mlp."),
    its Linears in `scheme`'s formats; shared_inter 0: no shared experts."""
    scheme = scheme or QuantScheme()
    shapes: dict[str, tuple[int, ...]] = {prefix + "gate.weight": (num_experts, hidden)}
    if bias:
        shapes[prefix + "gate.e_score_correction_bias"] = (num_experts,)
    for e in range(num_experts):
        shapes.update(swiglu_shapes(f"{prefix}experts.{e}.", hidden, expert_inter, scheme))
    if shared_inter:
        shapes.update(swiglu_shapes(prefix + "shared_experts.", hidden, shared_inter, scheme))
    return shapes


def expert_names(prefix: str, e: int) -> tuple[str, str, str]:
    p = f"{prefix}experts.{e}."
    return p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"


def load_moe_weights(ops: Ops, backend: Any, weights: Any, prefix: str, expert_inter: int, shared: bool,
                     bias: bool, expert_offset: int, expert_count: int,
                     scheme: QuantScheme | None = None) -> MoEWeights:
    """Stack experts [expert_offset, expert_offset + expert_count) as gate_up [E_local, 2I, D] and down
    [E_local, D, I] (one concatenating load each; quantized experts as stacks in their format, which `ops`, a
    quant_linear.QuantOps, runs); the router and its bias in float32."""
    experts = [expert_names(prefix, e) for e in range(expert_offset, expert_offset + expert_count)]
    modules = [tuple(n[: -len(".weight")] for n in names) for names in experts]
    if scheme is not None and scheme.format_of(modules[0][0]) != DENSE:
        gate_up = load_expert_stack(backend, weights, scheme, [(g, u) for g, u, _ in modules])
        down = load_expert_stack(backend, weights, scheme, [(d,) for _, _, d in modules])
    else:
        gate_up = backend.load(weights, *[n for gate, up, _ in experts for n in (gate, up)])
        down = backend.load(weights, *[d for _, _, d in experts])
        gate_up = gate_up.reshape(expert_count, 2 * expert_inter, -1)
        down = down.reshape(expert_count, -1, expert_inter)
    return MoEWeights(
        gate=backend.asarray(weights.get(prefix + "gate.weight"), "float32"),
        bias=backend.asarray(weights.get(prefix + "gate.e_score_correction_bias"), "float32") if bias else None,
        gate_up=gate_up, down=down,
        shared=load_swiglu(ops, backend, weights, prefix + "shared_experts.", scheme) if shared else None)
