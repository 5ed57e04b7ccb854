"""A MoE stand-in model line for the expert-parallel tests: the tiny Qwen3 decoder with a routed MoE
(softmax top-k over a few experts, renormalised) added to each layer's MLP. Its experts shard over
the ranks of `backend.comm` like a real MoE line's, so EP = N can be checked against EP = 1 without
depending on a particular model line. CPU only (numpy)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.line import PRESETS, Qwen3Line
from openinfer_qwen3.model import Qwen3Model

from openinfer.model_line import Probe
from openinfer.parallel import expert_shard
from openinfer.plugin_api import hookimpl

NAME = "ep-standin"
CONFIG = {**PRESETS["qwen3-tiny-untied"], "model_type": "openinfer_ep_standin", "num_experts": 8,
          "num_experts_per_tok": 2, "moe_intermediate_size": 32,
          "vocab_size": 512}


@dataclass(frozen=True)
class StandInConfig(Qwen3Config):
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0


class StandInModel(Qwen3Model):
    def __init__(self, cfg: StandInConfig, weights: Any, backend: Any, ops: Any) -> None:
        super().__init__(cfg, weights, backend, ops)
        self.comm = backend.comm
        rank, world = (0, 1) if self.comm is None else (self.comm.rank, self.comm.world_size)
        self.offset, count = expert_shard(cfg.num_experts, rank, world)
        self.router, self.experts = [], []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}.moe."
            self.router.append(weights.get(p + "router.weight"))
            self.experts.append([(backend.load(weights, f"{p}experts.{e}.gate.weight", f"{p}experts.{e}.up.weight"),
                                  backend.load(weights, f"{p}experts.{e}.down.weight"))
                                 for e in range(self.offset, self.offset + count)])

    def moe(self, x: np.ndarray, i: int) -> np.ndarray:
        """This rank's experts' share of the routed MoE, summed over the ranks."""
        logits = x @ self.router[i].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        ids = np.argsort(-probs, axis=-1, kind="stable")[:, : self.cfg.top_k]
        w = np.take_along_axis(probs, ids, -1)
        w /= w.sum(-1, keepdims=True)
        y = np.zeros_like(x)
        for j, (gate_up, down) in enumerate(self.experts[i]):
            t, k = np.nonzero(ids == self.offset + j)
            if len(t):
                y[t] += w[t, k, None] * self.ops.linear(self.ops.linear_silu_mul(x[t], gate_up), down)
        return y if self.comm is None else self.comm.all_reduce(y)

    def forward(self, batch: Any, state: Any) -> Any:
        ops, eps = self.ops, self.cfg.rms_norm_eps
        residual = ops.embedding(self.embed, batch.token_ids)
        x = ops.rms_norm(residual, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            x, residual = ops.add_rms_norm(layer.attn(x, batch, state), residual, layer.post_norm, eps)
            m = ops.linear(ops.linear_silu_mul(x, layer.gate_up), layer.down) + self.moe(x, i)
            next_norm = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.norm
            x, residual = ops.add_rms_norm(m, residual, next_norm, eps)
        return ops.linear(ops.gather_rows(x, batch.sample_rows), self.lm_head)


class StandInLine(Qwen3Line):
    name = NAME
    model_types = ("openinfer_ep_standin",)
    presets = {NAME: CONFIG}

    def probe(self, config: Mapping[str, Any]) -> Probe:
        return Probe(config.get("model_type") in self.model_types, "not the stand-in")

    def parse_config(self, config: Mapping[str, Any]) -> StandInConfig:
        base = Qwen3Config.from_dict(config)
        return StandInConfig(**{f.name: getattr(base, f.name) for f in fields(base)}, num_experts=config["num_experts"],
                             top_k=config["num_experts_per_tok"], moe_intermediate_size=config["moe_intermediate_size"])

    def weight_shapes(self, cfg: StandInConfig) -> dict[str, tuple[int, ...]]:
        shapes = super().weight_shapes(cfg)
        H, I = cfg.hidden_size, cfg.moe_intermediate_size
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}.moe."
            shapes[p + "router.weight"] = (cfg.num_experts, H)
            for e in range(cfg.num_experts):
                shapes.update({f"{p}experts.{e}.gate.weight": (I, H), f"{p}experts.{e}.up.weight": (I, H),
                               f"{p}experts.{e}.down.weight": (H, I)})
        return shapes

    def num_experts(self, cfg: StandInConfig) -> int:
        return cfg.num_experts

    def build(self, cfg: StandInConfig, weights: Any, backend: Any, ops: Any) -> StandInModel:
        return StandInModel(cfg, weights, backend, ops)


@hookimpl
def register_model_lines(register: Any) -> None:
    register(StandInLine)
