"""DeepSeek-V2's config.json (`model_type: deepseek_v2`), parsed and validated.

One parser for every V2 shape: V2-Lite (plain q_proj, greedy routing over 64 experts) and V2 / V2-Chat /
V2.5 (q-LoRA, group_limited_greedy over 160 experts in 8 groups). Layers below first_k_dense_replace
have a dense MLP, the others MoE with shared experts, as transformers builds them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from openinfer.plugin_api import ConfigError, MLADims, RopeConfig, RouterConfig, require, rope_config

# DeepSeek-V2's MoE gate always scores with a softmax; these are its two routings
TOPK_METHODS = ("greedy", "group_limited_greedy")


@dataclass(frozen=True)
class DeepseekV2Config:
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

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace

    @classmethod
    def from_dict(cls, c: Mapping[str, Any]) -> DeepseekV2Config:
        c = dict(c)
        heads = require(c, "num_attention_heads", int)
        layers = require(c, "num_hidden_layers", int)
        if c.get("num_key_value_heads") not in (None, heads):
            raise ConfigError(f"num_key_value_heads {c['num_key_value_heads']} differs from num_attention_heads "
                              f"{heads}: MLA has one latent per token, the deepseek_v2 line needs them equal")
        for flag in ("attention_bias", "mlp_bias"):
            if c.get(flag):
                raise ConfigError(f"{flag}: true is not supported by the deepseek_v2 line")
        if c.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {c.get('hidden_act')!r} is not supported (silu)")
        if c.get("scoring_func", "softmax") != "softmax":
            raise ConfigError(f"scoring_func {c['scoring_func']!r} is not supported by the deepseek_v2 line (softmax; "
                              "sigmoid routing is DeepSeek-V3's, served by its own line)")
        method = c.get("topk_method") or "greedy"
        if method not in TOPK_METHODS:
            raise ConfigError(f"topk_method {method!r} is not supported by the deepseek_v2 line "
                              f"({', '.join(TOPK_METHODS)})")
        if c.get("norm_topk_prob"):
            # transformers' DeepSeek-V2 ignores the flag while DeepSeek's own code renormalises; no released V2
            # checkpoint sets it, so the line refuses it rather than pick one reading
            raise ConfigError("norm_topk_prob: true is not supported by the deepseek_v2 line (transformers ignores "
                              "it for DeepSeek-V2; every released V2 checkpoint has false)")
        if c.get("moe_layer_freq", 1) != 1:
            raise ConfigError(f"moe_layer_freq {c['moe_layer_freq']} is not supported (1: every layer from "
                              "first_k_dense_replace on is MoE)")
        q_lora = c.get("q_lora_rank")
        if q_lora is not None and (not isinstance(q_lora, int) or q_lora < 1):
            raise ConfigError(f"q_lora_rank {q_lora!r} must be a positive integer or null")
        mla = MLADims(require(c, "hidden_size", int), heads, q_lora, require(c, "kv_lora_rank", int),
                      require(c, "qk_nope_head_dim", int), require(c, "qk_rope_head_dim", int),
                      require(c, "v_head_dim", int))
        if mla.qk_rope_head_dim % 2:
            raise ConfigError(f"qk_rope_head_dim {mla.qk_rope_head_dim} must be even (RoPE turns pairs)")
        experts = require(c, "n_routed_experts", int)
        router = RouterConfig(top_k=require(c, "num_experts_per_tok", int), scoring="softmax", method=method,
                              n_group=int(c.get("n_group") or 1), topk_group=int(c.get("topk_group") or 1),
                              norm_topk_prob=False,
                              routed_scaling_factor=float(c.get("routed_scaling_factor", 1.0)))
        router.check(experts)
        first_dense = int(c.get("first_k_dense_replace", 0))
        if not 0 <= first_dense <= layers:
            raise ConfigError(f"first_k_dense_replace {first_dense} must lie in 0 .. num_hidden_layers ({layers})")
        try:
            rope = rope_config(c, mla.qk_rope_head_dim)
        except (KeyError, ValueError) as e:
            raise ConfigError(f"rope_scaling / rope_parameters: {e}") from None
        return cls(mla.hidden_size, require(c, "intermediate_size", int), require(c, "moe_intermediate_size", int),
                   layers, first_dense, experts, int(c.get("n_shared_experts") or 0), require(c, "vocab_size", int),
                   int(c.get("max_position_embeddings", 2048)), float(c.get("rms_norm_eps", 1e-6)),
                   bool(c.get("tie_word_embeddings", False)), mla, router, rope)
