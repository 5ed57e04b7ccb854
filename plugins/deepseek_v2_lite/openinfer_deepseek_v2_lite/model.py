"""The DeepSeek-V2 decoder, written against the op registry (runs on every backend): MLA attention in
every layer; a dense SwiGLU MLP below first_k_dense_replace, DeepSeekMoE (routed + shared experts) above."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from openinfer.plugin_api import (Array, Communicator, ForwardBatch, MLAttention, Model, MoE, Ops, StatePools,
                                  WeightSource, cos_sin, load_mla_weights, load_moe_weights, load_swiglu,
                                  mla_softmax_scale)

from .config import DeepseekV2Config


@dataclass
class Layer:
    input_norm: Array
    post_norm: Array
    attn: MLAttention
    mlp: Callable[[Array], Array]     # SwiGLU or MoE


class DeepseekV2Model(Model):
    def __init__(self, cfg: DeepseekV2Config, weights: WeightSource, backend, ops: Ops,
                 expert_shard: tuple[int, int] | None = None, comm: Communicator | None = None) -> None:
        self.cfg, self.ops = cfg, ops
        offset, count = expert_shard or (0, cfg.n_routed_experts)
        if not (0 <= offset and 1 <= count and offset + count <= cfg.n_routed_experts):
            raise ValueError(f"expert shard ({offset}, {count}) does not fit {cfg.n_routed_experts} routed experts")

        def load(*names: str) -> Array:
            return backend.load(weights, *names)

        cos, sin = cos_sin(cfg.rope, cfg.max_position_embeddings)
        cos, sin = backend.asarray(cos, "float32"), backend.asarray(sin, "float32")
        scale = mla_softmax_scale(cfg.mla, cfg.rope)
        self.embed = load("model.embed_tokens.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings else load("lm_head.weight")
        self.norm = load("model.norm.weight")
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            attn = MLAttention(ops, i, cfg.mla, scale, cos, sin,
                               load_mla_weights(backend, weights, p + "self_attn.", cfg.mla))
            if cfg.is_moe(i):
                w = load_moe_weights(ops, backend, weights, p + "mlp.", cfg.moe_intermediate_size,
                                     shared=cfg.n_shared_experts > 0, bias=False, expert_offset=offset,
                                     expert_count=count)
                mlp: Callable[[Array], Array] = MoE(ops, cfg.router, w, offset, comm)
            else:
                mlp = load_swiglu(ops, backend, weights, p + "mlp.")
            self.layers.append(Layer(load(p + "input_layernorm.weight"), load(p + "post_attention_layernorm.weight"),
                                     attn, mlp))

    def forward(self, batch: ForwardBatch, state: StatePools) -> Array:
        ops, eps = self.ops, self.cfg.rms_norm_eps
        residual = ops.embedding(self.embed, batch.token_ids)
        x = ops.rms_norm(residual, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            x, residual = ops.add_rms_norm(layer.attn(x, batch, state), residual, layer.post_norm, eps)
            next_norm = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.norm
            x, residual = ops.add_rms_norm(layer.mlp(x), residual, next_norm, eps)
        return ops.linear(ops.gather_rows(x, batch.sample_rows), self.lm_head)
