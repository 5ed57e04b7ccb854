"""Qwen3.5's config.json (the real `text_config` layout or a text-only one), parsed and validated."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from openinfer.plugin_api import ConfigError, RopeConfig, optional, require, rope_config


@dataclass(frozen=True)
class Qwen35Config:
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]          # "linear_attention" (Gated DeltaNet) or "full_attention"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope: RopeConfig                       # rotary_dim = partial_rotary_factor * head_dim
    prefix: str                            # checkpoint name prefix of the language model

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q and k (nk * dk each) and v (nv * dv)."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_num_value_heads * self.linear_value_head_dim

    @classmethod
    def from_dict(cls, c: Mapping[str, Any]) -> Qwen35Config:
        # the real checkpoints are Qwen3_5ForConditionalGeneration: text settings in text_config,
        # weights under model.language_model.; a text-only export keeps both at the top level
        vl = isinstance(c.get("text_config"), Mapping)
        t = dict(c["text_config"]) if vl else dict(c)
        tie = optional(c, "tie_word_embeddings", bool, optional(t, "tie_word_embeddings", bool, False))
        n = require(t, "num_hidden_layers", int)
        layer_types = t.get("layer_types") or [
            "full_attention" if (i + 1) % optional(t, "full_attention_interval", int, 4, minimum=1) == 0
            else "linear_attention"
            for i in range(n)]
        if len(layer_types) != n or set(layer_types) - {"linear_attention", "full_attention"}:
            raise ConfigError(f"layer_types must list {n} entries of linear_attention / full_attention")
        heads, kv = require(t, "num_attention_heads", int), require(t, "num_key_value_heads", int)
        nk, nv = require(t, "linear_num_key_heads", int), require(t, "linear_num_value_heads", int)
        if heads % kv:
            raise ConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        if nv % nk:
            raise ConfigError(f"linear_num_value_heads {nv} is not a multiple of linear_num_key_heads {nk}")
        if t.get("attention_bias"):
            raise ConfigError("attention_bias: true is not supported by the qwen35 line")
        if t.get("attn_output_gate", True) is not True:
            raise ConfigError("attn_output_gate: false is not supported by the qwen35 line")
        if t.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {t.get('hidden_act')!r} is not supported (silu)")
        head_dim = optional(t, "head_dim", int, require(t, "hidden_size", int) // heads, minimum=1)
        params = t.get("rope_parameters") or {}
        if not isinstance(params, Mapping):
            raise ConfigError(f"rope_parameters {params!r} must be an object")
        partial = optional(params, "partial_rotary_factor", float, optional(t, "partial_rotary_factor", float, 1.0),
                           positive=True)
        rotary_dim = int(head_dim * partial)
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ConfigError(f"partial_rotary_factor {partial} gives an unusable rotary dim {rotary_dim}")
        return cls(require(t, "hidden_size", int), require(t, "intermediate_size", int), tuple(layer_types), heads, kv,
                   head_dim, nk, nv, require(t, "linear_key_head_dim", int), require(t, "linear_value_head_dim", int),
                   optional(t, "linear_conv_kernel_dim", int, 4, minimum=1), require(t, "vocab_size", int),
                   optional(t, "max_position_embeddings", int, 262144, minimum=1),
                   optional(t, "rms_norm_eps", float, 1e-6, positive=True), tie,
                   rope_config(t, rotary_dim), "model.language_model." if vl else "model.")
