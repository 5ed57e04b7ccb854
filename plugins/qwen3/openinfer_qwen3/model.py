"""The Qwen3 dense decoder, written against the op registry (runs on every backend)."""
from __future__ import annotations

from dataclasses import dataclass

from openinfer.plugin_api import (Array, AttentionWeights, ForwardBatch, GQAAttention, Model, Ops, StatePools,
                                  WeightSource, cos_sin)

from .config import Qwen3Config


@dataclass
class Layer:
    input_norm: Array
    post_norm: Array
    attn: GQAAttention
    gate_up: Array      # [2I, H]: gate and up fused at load
    down: Array         # [H, I]


class Qwen3Model(Model):
    def __init__(self, cfg: Qwen3Config, weights: WeightSource, backend, ops: Ops) -> None:
        self.cfg, self.ops = cfg, ops

        def load(*names: str) -> Array:
            return backend.load(weights, *names)

        cos, sin = cos_sin(cfg.rope, cfg.max_position_embeddings)
        cos, sin = backend.asarray(cos, "float32"), backend.asarray(sin, "float32")
        self.embed = load("model.embed_tokens.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings else load("lm_head.weight")
        self.norm = load("model.norm.weight")
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            attn_w = AttentionWeights(
                qkv=load(p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"),
                o=load(p + "self_attn.o_proj.weight"),
                q_norm=load(p + "self_attn.q_norm.weight"), k_norm=load(p + "self_attn.k_norm.weight"))
            self.layers.append(Layer(
                input_norm=load(p + "input_layernorm.weight"),
                post_norm=load(p + "post_attention_layernorm.weight"),
                attn=GQAAttention(ops, i, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps,
                                  cos, sin, attn_w),
                gate_up=load(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                down=load(p + "mlp.down_proj.weight")))

    def forward(self, batch: ForwardBatch, state: StatePools) -> Array:
        ops, eps = self.ops, self.cfg.rms_norm_eps
        h = ops.embedding(self.embed, batch.token_ids)
        residual = h
        x = ops.rms_norm(h, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            a = layer.attn(x, batch, state)
            x, residual = ops.add_rms_norm(a, residual, layer.post_norm, eps)
            m = ops.linear(ops.linear_silu_mul(x, layer.gate_up), layer.down)
            next_norm = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.norm
            x, residual = ops.add_rms_norm(m, residual, next_norm, eps)
        return ops.linear(ops.gather_rows(x, batch.sample_rows), self.lm_head)
