"""The Qwen3.5 hybrid decoder, written against the op registry (runs on every backend).

Zero-centred RMSNorms (`x̂ · (1 + w)`: input/post-attention/final norms and q_norm/k_norm) are
folded to `1 + w` at load, so the shared rms_norm ops apply them unchanged. The folded weights
stay float32 on every backend, as transformers computes `1 + w` in fp32: in bf16, 1 + w would be
rounded to steps of 2^-7, coarser than the small w itself (the CUDA norm kernels take f32 weights
beside bf16 activations). M-RoPE reduces to plain RoPE for text (its three position streams are
equal), on the first rotary_dim dims.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from openinfer.plugin_api import Array, AttentionWeights, ForwardBatch, Model, Ops, StatePools, WeightSource, cos_sin

from .config import Qwen35Config
from .layers import GatedAttention, GatedDeltaNet, GDNWeights


@dataclass
class Layer:
    input_norm: Array
    post_norm: Array
    mixer: GatedDeltaNet | GatedAttention
    gate_up: Array      # [2I, H]: gate and up fused at load
    down: Array         # [H, I]


class Qwen35Model(Model):
    # every decode graph on PDL: Qwen3.5-4B's steps of 16 and 32 rows measured ~1 % faster with it, 128 alike
    # (docs/benchmarks/qwen35-4b.md)
    pdl_decode_rows = None

    def __init__(self, cfg: Qwen35Config, weights: WeightSource, backend, ops: Ops) -> None:
        self.cfg, self.ops = cfg, ops

        def load(*names: str) -> Array:
            return backend.load(weights, *(cfg.prefix + n for n in names))

        def norm1p(name: str) -> Array:
            return backend.asarray(weights.get(cfg.prefix + name).astype(np.float32) + np.float32(1), "float32")

        cos, sin = cos_sin(cfg.rope, cfg.max_position_embeddings)
        cos, sin = backend.asarray(cos, "float32"), backend.asarray(sin, "float32")
        nh, nkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # q_proj interleaves [q_h | gate_h] per head: rows reordered to [q | k | v | gate] (one GEMM)
        heads = np.arange(nh)[:, None] * 2 * d
        q_rows, gate_rows = (heads + np.arange(d)).ravel(), (heads + d + np.arange(d)).ravel()
        qkvg_order = backend.asarray(np.concatenate([q_rows, 2 * nh * d + np.arange(2 * nkv * d), gate_rows])
                                     .astype(np.int32))
        self.embed = load("embed_tokens.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings else backend.load(weights, "lm_head.weight")
        self.norm = norm1p("norm.weight")
        self.layers: list[Layer] = []
        n_linear = n_full = 0
        for i, kind in enumerate(cfg.layer_types):
            p = f"layers.{i}."
            if kind == "linear_attention":
                la = p + "linear_attn."
                mixer: GatedDeltaNet | GatedAttention = GatedDeltaNet(ops, cfg, n_linear, GDNWeights(
                    in_proj=load(la + "in_proj_qkv.weight", la + "in_proj_z.weight", la + "in_proj_b.weight",
                                 la + "in_proj_a.weight"),
                    conv=load(la + "conv1d.weight").reshape(cfg.conv_dim, cfg.conv_kernel),
                    A_log=backend.asarray(weights.get(cfg.prefix + la + "A_log"), "float32"),
                    dt_bias=backend.asarray(weights.get(cfg.prefix + la + "dt_bias"), "float32"),
                    norm=load(la + "norm.weight"), out_proj=load(la + "out_proj.weight")), backend.zeros)
                n_linear += 1
            else:
                sa = p + "self_attn."
                w = AttentionWeights(
                    qkv=ops.gather_rows(load(sa + "q_proj.weight", sa + "k_proj.weight", sa + "v_proj.weight"),
                                        qkvg_order),
                    o=load(sa + "o_proj.weight"), q_norm=norm1p(sa + "q_norm.weight"),
                    k_norm=norm1p(sa + "k_norm.weight"))
                mixer = GatedAttention(ops, n_full, nh, nkv, d, cfg.rms_norm_eps, cos, sin, w)
                n_full += 1
            self.layers.append(Layer(
                input_norm=norm1p(p + "input_layernorm.weight"), post_norm=norm1p(p + "post_attention_layernorm.weight"),
                mixer=mixer, gate_up=load(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                down=load(p + "mlp.down_proj.weight")))

    def forward(self, batch: ForwardBatch, state: StatePools) -> Array:
        ops, eps = self.ops, self.cfg.rms_norm_eps
        residual = ops.embedding(self.embed, batch.token_ids)
        x = ops.rms_norm(residual, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            a = layer.mixer(x, batch, state)
            x, residual = ops.add_rms_norm(a, residual, layer.post_norm, eps)
            m = ops.linear(ops.linear_silu_mul(x, layer.gate_up), layer.down)
            next_norm = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.norm
            x, residual = ops.add_rms_norm(m, residual, next_norm, eps)
        return ops.linear(ops.gather_rows(x, batch.sample_rows), self.lm_head)
