"""The GLM-5.x decoder, written against the op registry (runs on every backend).

Every layer is MLA (core layers/mla.py) with DeepSeek Sparse Attention: a full layer's indexer selects each
query's index_topk keys, a shared layer reuses the selection of the last full layer before it, and the
attention runs over the selected latents only. While no sequence of the step holds more than index_topk
keys, every key is selected, so the step runs plain MLA attention (the indexer still writes its keys).
The MLP is dense SwiGLU or a noaux_tc MoE (core layers/moe.py), sharded by expert parallelism when the
backend belongs to a group. Linears stored in FP8 (cfg.quant) stay FP8 on the device; the layers run them through
quant_linear's QuantOps, which picks each weight's op by its format.
"""
from __future__ import annotations

from dataclasses import dataclass

from openinfer.plugin_api import (MLA_OPS, MOE_OPS, Array, ForwardBatch, MLADims, MLAttention, Model, MoE, Ops,
                                  QuantOps, RouterConfig, StatePools, SwiGLU, WeightSource, cos_sin, expert_shard,
                                  load_mla_weights, load_moe_weights, load_swiglu, mla_softmax_scale,
                                  quant_ops_needed)

from .config import Glm52Config
from .indexer import Indexer, load_indexer_weights

_KERNEL_PLAN = ("embedding", "rms_norm", "add_rms_norm", "linear", "linear_silu_mul", "gather_rows",
               *MLA_OPS, "router_logits", *MOE_OPS, "glm52_indexer_rope_write", "glm52_indexer_topk",
               "glm52_sparse_mla_attention")


def kernel_plan(cfg: Glm52Config) -> list[str]:
    return list(_KERNEL_PLAN) + quant_ops_needed(cfg.quant, "sparse" in cfg.mlp_layer_types)


def mla_dims(cfg: Glm52Config) -> MLADims:
    return MLADims(cfg.hidden_size, cfg.num_heads, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim,
                   cfg.qk_rope_head_dim, cfg.v_head_dim)


def router_config(cfg: Glm52Config) -> RouterConfig:
    router = RouterConfig(cfg.num_experts_per_tok, "sigmoid", "noaux_tc", cfg.n_group, cfg.topk_group,
                          cfg.norm_topk_prob, cfg.routed_scaling_factor)
    router.check(cfg.n_routed_experts)
    return router


@dataclass
class Layer:
    input_norm: Array
    post_norm: Array
    attn: MLAttention
    indexer: Indexer | None       # None on a shared layer
    mlp: SwiGLU | MoE


class Glm52Model(Model):
    def __init__(self, cfg: Glm52Config, weights: WeightSource, backend, ops: Ops) -> None:
        self.cfg, scheme = cfg, cfg.quant
        self.ops = ops = ops if scheme.method == "dense" else QuantOps(ops)

        def load(*names: str) -> Array:
            return backend.load(weights, *names)

        cos, sin = cos_sin(cfg.rope, cfg.max_position_embeddings)
        cos, sin = backend.asarray(cos, "float32"), backend.asarray(sin, "float32")
        dims = mla_dims(cfg)
        self.scale = mla_softmax_scale(dims, cfg.rope)
        comm = getattr(backend, "comm", None)
        offset, count = (0, cfg.n_routed_experts) if comm is None else \
            expert_shard(cfg.n_routed_experts, comm.rank, comm.world_size)
        router = router_config(cfg)
        self.embed = load("model.embed_tokens.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings else load("lm_head.weight")
        self.norm = load("model.norm.weight")
        slots = {layer: slot for slot, layer in enumerate(cfg.full_layers)}
        self.layers: list[Layer] = []
        for i in range(cfg.num_layers):
            p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
            attn = MLAttention(ops, i, dims, self.scale, cos, sin, load_mla_weights(backend, weights, a, dims, scheme))
            indexer = None
            if i in slots:
                w = load_indexer_weights(backend, weights, a + "indexer.", scheme)
                indexer = Indexer(ops, slots[i], cfg, cos, sin, w)
            if cfg.mlp_layer_types[i] == "dense":
                mlp: SwiGLU | MoE = load_swiglu(ops, backend, weights, p + "mlp.", scheme)
            else:
                w = load_moe_weights(ops, backend, weights, p + "mlp.", cfg.moe_intermediate_size,
                                     cfg.n_shared_experts > 0, True, offset, count, scheme)
                mlp = MoE(ops, router, w, offset, comm)
            self.layers.append(Layer(load(p + "input_layernorm.weight"), load(p + "post_attention_layernorm.weight"),
                                     attn, indexer, mlp))

    def attention(self, layer: Layer, x: Array, batch: ForwardBatch, state: StatePools, dense: bool,
                  selected: Array | None) -> tuple[Array, Array | None]:
        """One layer's sparse attention: (output [T, D], the selection the next shared layer reuses)."""
        q_latent, q_pe, q_resid = layer.attn.project(x, batch, state)
        cache = layer.attn.cache(state)
        if layer.indexer is not None:
            q_index = layer.indexer.write_keys(x, q_resid, batch, state)
            if not dense:
                selected = layer.indexer.select(q_index, x, batch, state)
        if dense:
            out = self.ops.mla_attention(q_latent, q_pe, cache, batch, self.scale)
        else:
            out = self.ops.glm52_sparse_mla_attention(q_latent, q_pe, cache, selected, batch, self.scale)
        return layer.attn.output(out), selected

    def forward(self, batch: ForwardBatch, state: StatePools) -> Array:
        ops, eps = self.ops, self.cfg.rms_norm_eps
        # No sequence holds more keys than the indexer keeps: every key is selected, attention is dense.
        # (A decode graph's batch carries the model's length here, so it always takes the sparse path.)
        dense = batch.max_context_len <= self.cfg.index_topk
        h = ops.embedding(self.embed, batch.token_ids)
        residual = h
        x = ops.rms_norm(h, self.layers[0].input_norm, eps)
        selected = None
        for i, layer in enumerate(self.layers):
            a, selected = self.attention(layer, x, batch, state, dense, selected)
            x, residual = ops.add_rms_norm(a, residual, layer.post_norm, eps)
            m = layer.mlp(x)
            next_norm = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.norm
            x, residual = ops.add_rms_norm(m, residual, next_norm, eps)
        return ops.linear(ops.gather_rows(x, batch.sample_rows), self.lm_head)
