"""The DeepSeek-V3 decoder shape (DeepSeek-V3, Kimi-K2, and the V2 layout): MLA attention in every layer, a dense
SwiGLU MLP below first_k_dense_replace and DeepSeekMoE (routed + shared experts) above, an RMSNorm'd residual
stream, written against the op registry so it runs on every backend. Linears may be stored quantized
(openinfer.quant; the layers run them through quant_linear.QuantOps); the checkpoint's names may carry a prefix
(a multimodal wrapper's "language_model.").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..engine.batch import Array, ForwardBatch
from ..loading.config import ConfigError, optional, require
from ..kernels.registry import Ops
from ..kv.pool import StatePools
from ..contract.model_line import Model
from ..quant import QuantScheme, quant_scheme
from ..quant.scheme import DENSE
from .mla import OPS as MLA_OPS, MLADims, MLAttention, load_mla_weights, mla_softmax_scale, mla_weight_shapes
from .mlp import load_swiglu, swiglu_shapes
from .moe import OPS as MOE_OPS, MoE, RouterConfig, load_moe_weights, moe_weight_shapes
from .quant_linear import QuantOps, quant_ops_needed
from .rope import RopeConfig, cos_sin, rope_config


@dataclass(frozen=True)
class MLAMoEConfig:
    hidden_size: int
    intermediate_size: int           # the dense layers' MLP
    moe_intermediate_size: int       # one expert's
    num_layers: int
    first_k_dense_replace: int
    n_routed_experts: int
    n_shared_experts: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    mla: MLADims
    router: RouterConfig
    rope: RopeConfig
    quant: QuantScheme = field(default_factory=QuantScheme)
    prefix: str = ""                 # of every checkpoint name ("language_model." in Kimi-K2.5's wrapper)

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace

    @property
    def has_moe(self) -> bool:
        return self.first_k_dense_replace < self.num_layers

    @property
    def router_bias(self) -> bool:
        """noaux_tc routing selects on scores + e_score_correction_bias."""
        return self.router.method == "noaux_tc"


def parse_mla_moe(c: Mapping[str, Any], router: RouterConfig, line: str, prefix: str = "",
                  default_max_position: int = 4096) -> MLAMoEConfig:
    """The DeepSeek-layout fields of config.json `c` (checked; a ConfigError names the field) with the line's own
    `router` (which the line reads and checks itself, as the architectures route differently)."""
    heads = require(dict(c), "num_attention_heads", int)
    layers = require(dict(c), "num_hidden_layers", int)
    if c.get("num_key_value_heads") not in (None, heads):
        raise ConfigError(f"num_key_value_heads {c['num_key_value_heads']} differs from num_attention_heads {heads}: "
                          f"MLA keeps one latent per token, the {line} line needs them equal")
    for flag in ("attention_bias", "mlp_bias"):
        if c.get(flag):
            raise ConfigError(f"{flag}: true is not supported by the {line} line")
    if c.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act {c.get('hidden_act')!r} is not supported (silu)")
    if c.get("moe_layer_freq", 1) != 1:
        raise ConfigError(f"moe_layer_freq {c['moe_layer_freq']} is not supported (1: every layer from "
                          "first_k_dense_replace on is MoE)")
    q_lora = c.get("q_lora_rank")
    if q_lora is not None and (not isinstance(q_lora, int) or q_lora < 1):
        raise ConfigError(f"q_lora_rank {q_lora!r} must be a positive integer or null")
    g = dict(c)
    mla = MLADims(require(g, "hidden_size", int), heads, q_lora, require(g, "kv_lora_rank", int),
                  require(g, "qk_nope_head_dim", int), require(g, "qk_rope_head_dim", int), require(g, "v_head_dim", int))
    if mla.qk_rope_head_dim % 2:
        raise ConfigError(f"qk_rope_head_dim {mla.qk_rope_head_dim} must be even (RoPE turns pairs)")
    first_dense = optional(g, "first_k_dense_replace", int, 0)
    if not 0 <= first_dense <= layers:
        raise ConfigError(f"first_k_dense_replace {first_dense} must lie in 0 .. num_hidden_layers ({layers})")
    return MLAMoEConfig(
        mla.hidden_size, require(g, "intermediate_size", int), require(g, "moe_intermediate_size", int), layers,
        first_dense, require(g, "n_routed_experts", int), optional(g, "n_shared_experts", int, 0, minimum=0),
        require(g, "vocab_size", int), optional(g, "max_position_embeddings", int, default_max_position, minimum=1),
        optional(g, "rms_norm_eps", float, 1e-6, positive=True), optional(g, "tie_word_embeddings", bool, False),
        mla, router, rope_config(c, mla.qk_rope_head_dim), quant_scheme(c), prefix)


def mla_moe_weight_shapes(cfg: MLAMoEConfig) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor the decoder loads, with its shape, in the checkpoint's formats."""
    D, p0 = cfg.hidden_size, cfg.prefix
    shapes = {p0 + "model.embed_tokens.weight": (cfg.vocab_size, D), p0 + "model.norm.weight": (D,)}
    if not cfg.tie_word_embeddings:
        shapes[p0 + "lm_head.weight"] = (cfg.vocab_size, D)
    for i in range(cfg.num_layers):
        p = f"{p0}model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,)})
        shapes.update(mla_weight_shapes(p + "self_attn.", cfg.mla, cfg.quant))
        if cfg.is_moe(i):
            shapes.update(moe_weight_shapes(p + "mlp.", D, cfg.n_routed_experts, cfg.moe_intermediate_size,
                                            cfg.moe_intermediate_size * cfg.n_shared_experts, cfg.router_bias,
                                            cfg.quant))
        else:
            shapes.update(swiglu_shapes(p + "mlp.", D, cfg.intermediate_size, cfg.quant))
    return shapes


def mla_moe_kernel_plan(cfg: MLAMoEConfig) -> list[str]:
    plan = ["embedding", "rms_norm", "add_rms_norm", "linear", "linear_silu_mul", "gather_rows", *MLA_OPS,
            "mla_gather_latent", "mla_pack_heads", "paged_attention"]   # the last three: the expanded prefill
    if cfg.has_moe:
        plan += list(MOE_OPS)
    return plan + quant_ops_needed(cfg.quant, cfg.has_moe)


@dataclass
class _Layer:
    input_norm: Array
    post_norm: Array
    attn: MLAttention
    mlp: Callable[[Array], Array]     # SwiGLU or MoE


class MLAMoEDecoder(Model):
    """`expert_shard` (offset, count): the routed experts this rank holds (all by default); `comm` sums the
    ranks' routed outputs (expert parallelism). Every decode graph on PDL: DeepSeek-V2-Lite's steps of 32 and 128
    rows measured 1-1.5 % faster with it (docs/benchmarks/deepseek-v2-lite.md)."""
    pdl_decode_rows = None

    def __init__(self, cfg: MLAMoEConfig, weights: Any, backend: Any, ops: Ops,
                 expert_shard: tuple[int, int] | None = None, comm: Any = None) -> None:
        self.cfg = cfg
        self.ops = ops if cfg.quant.method == DENSE else QuantOps(ops)
        offset, count = expert_shard or (0, cfg.n_routed_experts)
        if not (0 <= offset and 1 <= count and offset + count <= cfg.n_routed_experts):
            raise ValueError(f"expert shard ({offset}, {count}) does not fit {cfg.n_routed_experts} routed experts")
        p0, scheme = cfg.prefix, cfg.quant

        def load(name: str) -> Array:
            return backend.load(weights, p0 + name)

        cos, sin = cos_sin(cfg.rope, cfg.max_position_embeddings)
        cos, sin = backend.asarray(cos, "float32"), backend.asarray(sin, "float32")
        scale = mla_softmax_scale(cfg.mla, cfg.rope)
        self.embed = load("model.embed_tokens.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings else load("lm_head.weight")
        self.norm = load("model.norm.weight")
        self.layers: list[_Layer] = []
        for i in range(cfg.num_layers):
            p = f"{p0}model.layers.{i}."
            attn = MLAttention(self.ops, i, cfg.mla, scale, cos, sin,
                               load_mla_weights(backend, weights, p + "self_attn.", cfg.mla, scheme))
            if cfg.is_moe(i):
                w = load_moe_weights(self.ops, backend, weights, p + "mlp.", cfg.moe_intermediate_size,
                                     shared=cfg.n_shared_experts > 0, bias=cfg.router_bias, expert_offset=offset,
                                     expert_count=count, scheme=scheme)
                mlp: Callable[[Array], Array] = MoE(self.ops, cfg.router, w, offset, comm)
            else:
                mlp = load_swiglu(self.ops, backend, weights, p + "mlp.", scheme)
            self.layers.append(_Layer(load(f"model.layers.{i}.input_layernorm.weight"),
                                      load(f"model.layers.{i}.post_attention_layernorm.weight"), attn, mlp))

    def forward(self, batch: ForwardBatch, state: StatePools) -> Array:
        ops, eps = self.ops, self.cfg.rms_norm_eps
        residual = ops.embedding(self.embed, batch.token_ids)
        x = ops.rms_norm(residual, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            x, residual = ops.add_rms_norm(layer.attn(x, batch, state), residual, layer.post_norm, eps)
            next_norm = self.layers[i + 1].input_norm if i + 1 < len(self.layers) else self.norm
            x, residual = ops.add_rms_norm(layer.mlp(x), residual, next_norm, eps)
        return ops.linear(ops.gather_rows(x, batch.sample_rows), self.lm_head)
