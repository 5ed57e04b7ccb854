"""Qwen3's config.json, parsed and validated."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from openinfer.plugin_api import ConfigError, RopeConfig, optional, require, rope_config


@dataclass(frozen=True)
class Qwen3Config:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope: RopeConfig

    @classmethod
    def from_dict(cls, c: Mapping[str, Any]) -> Qwen3Config:
        c = dict(c)
        heads = require(c, "num_attention_heads", int)
        hidden = require(c, "hidden_size", int)
        head_dim = optional(c, "head_dim", int, hidden // heads, minimum=1)
        kv = optional(c, "num_key_value_heads", int, heads, minimum=1)
        if heads % kv:
            raise ConfigError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        if c.get("attention_bias"):
            raise ConfigError("attention_bias: true is not supported by the qwen3 line")
        if c.get("use_sliding_window"):
            raise ConfigError("use_sliding_window: true is not supported by the qwen3 line")
        if c.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {c.get('hidden_act')!r} is not supported (silu)")
        return cls(hidden, require(c, "intermediate_size", int), require(c, "num_hidden_layers", int), heads, kv,
                   head_dim, require(c, "vocab_size", int),
                   optional(c, "max_position_embeddings", int, 40960, minimum=1),
                   optional(c, "rms_norm_eps", float, 1e-6, positive=True),
                   optional(c, "tie_word_embeddings", bool, False), rope_config(c, head_dim))
