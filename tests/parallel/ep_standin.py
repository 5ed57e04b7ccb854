"""A MoE stand-in model line for the core's expert-parallel tests: the tiny Qwen3 decoder with the core MoE
layer (softmax top-k over a few routed experts, renormalised) added to each layer's MLP. Its experts shard
over the ranks of `backend.comm` as a real MoE line's do, so the executor, the workers and the
communicators are tested without a particular MoE line; its random weights need no checkpoint."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Mapping

from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.line import PRESETS, Qwen3Line
from openinfer_qwen3.model import Qwen3Model

from openinfer.plugin_api import (MoE, Probe, RouterConfig, expert_shard, hookimpl, load_moe_weights,
                                  moe_weight_shapes)

NAME = "ep-standin"
FAIL_RANK = "OPENINFER_TEST_EP_FAIL_RANK"   # this rank's load raises (worker processes inherit the environment)
CONFIG = {**PRESETS["qwen3-tiny-untied"], "model_type": "openinfer_ep_standin", "vocab_size": 512,
          "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


@dataclass(frozen=True)
class StandInConfig(Qwen3Config):
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0


class StandInModel(Qwen3Model):
    def __init__(self, cfg: StandInConfig, weights: Any, backend: Any, ops: Any) -> None:
        super().__init__(cfg, weights, backend, ops)
        comm = backend.comm
        if comm is not None and os.environ.get(FAIL_RANK) == str(comm.rank):
            raise RuntimeError(f"rank {comm.rank} was told to fail its load")
        offset, count = (0, cfg.num_experts) if comm is None else expert_shard(cfg.num_experts, comm.rank,
                                                                                comm.world_size)
        router = RouterConfig(cfg.top_k, norm_topk_prob=True)
        self.moe = [MoE(ops, router, load_moe_weights(ops, backend, weights, f"model.layers.{i}.moe.",
                                                      cfg.moe_intermediate_size, shared=False, bias=False,
                                                      expert_offset=offset, expert_count=count), offset, comm)
                    for i in range(cfg.num_layers)]

    def forward(self, batch: Any, state: Any) -> Any:
        ops, eps = self.ops, self.cfg.rms_norm_eps
        residual = ops.embedding(self.embed, batch.token_ids)
        x = ops.rms_norm(residual, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            x, residual = ops.add_rms_norm(layer.attn(x, batch, state), residual, layer.post_norm, eps)
            m = ops.linear(ops.linear_silu_mul(x, layer.gate_up), layer.down) + self.moe[i](x)
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
        for i in range(cfg.num_layers):
            shapes.update(moe_weight_shapes(f"model.layers.{i}.moe.", cfg.hidden_size, cfg.num_experts,
                                            cfg.moe_intermediate_size, 0, bias=False))
        return shapes

    def kernel_plan(self, cfg: StandInConfig) -> list[str]:
        return super().kernel_plan(cfg) + ["moe_router", "moe_experts"]

    def num_experts(self, cfg: StandInConfig) -> int:
        return cfg.num_experts

    def build(self, cfg: StandInConfig, weights: Any, backend: Any, ops: Any) -> StandInModel:
        return StandInModel(cfg, weights, backend, ops)


@hookimpl
def register_model_lines(register: Any) -> None:
    register(StandInLine)
