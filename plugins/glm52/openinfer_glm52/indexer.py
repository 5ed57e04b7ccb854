"""The lightning indexer of DeepSeek Sparse Attention, as GLM-5.x runs it on its "full" layers.

Per token: an indexer query of Hi heads from the normalised q-LoRA activation (wq_b), one key from the
layer input (wk, then LayerNorm with bias), both turned by RoPE on their first qk_rope_head_dim dims, and
per-head weights (weights_proj, float32, times Hi^-0.5). wq_b and wk are in the checkpoint's format (FP8
ones stay FP8 and run through the model's QuantOps); weights_proj is never quantized. The keys go to the
"indexer" paged state group, which holds one layer slice per full layer, so prefix caching, offload and
admission treat them as any KV.
A query's selection is its index_topk best keys by sum_h w_h * relu(q_h · k * Di^-0.5) under the causal mask.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from openinfer.plugin_api import (Array, ForwardBatch, Ops, QuantScheme, StatePools, StateGroup, host_linear,
                                  load_linear)

from .config import Glm52Config

STATE_GROUP = "indexer"


def indexer_state_group(cfg: Glm52Config) -> StateGroup:
    """Index_head_dim values per token on each full layer only (a shared layer keeps none)."""
    return StateGroup(STATE_GROUP, "paged", len(cfg.full_layers), {"key": (cfg.index_head_dim,)})


def indexer_weight_shapes(prefix: str, cfg: Glm52Config) -> dict[str, tuple[int, ...]]:
    """Names and shapes under `prefix` (e.g. "model.layers.0.self_attn.indexer."), in cfg.quant's formats."""
    Hi, Di, q = cfg.index_n_heads, cfg.index_head_dim, cfg.quant
    return {**q.linear_shapes(prefix + "wq_b", Hi * Di, cfg.q_lora_rank),
            **q.linear_shapes(prefix + "wk", Di, cfg.hidden_size),
            prefix + "k_norm.weight": (Di,), prefix + "k_norm.bias": (Di,),
            **q.linear_shapes(prefix + "weights_proj", Hi, cfg.hidden_size)}


@dataclass
class IndexerWeights:
    wq_b: Array           # [Hi Di, q_lora], in the checkpoint's format
    wk: Array             # [Di, D], in the checkpoint's format
    k_norm_w: Array       # [Di]
    k_norm_b: Array       # [Di]
    weights_proj: Array   # [Hi, D] float32, as transformers keeps it


def load_indexer_weights(backend: Any, weights: Any, prefix: str, scheme: QuantScheme) -> IndexerWeights:
    """A weights_proj stored in a quantized dtype is refused naming it (host_linear checks the dtype)."""
    return IndexerWeights(
        wq_b=load_linear(backend, weights, scheme, prefix + "wq_b"),
        wk=load_linear(backend, weights, scheme, prefix + "wk"),
        k_norm_w=backend.load(weights, prefix + "k_norm.weight"), k_norm_b=backend.load(weights, prefix + "k_norm.bias"),
        weights_proj=backend.asarray(host_linear(weights, scheme, prefix + "weights_proj"), "float32"))


class Indexer:
    """One full layer's indexer; `slot` is its layer slice in the indexer state group."""

    def __init__(self, ops: Ops, slot: int, cfg: Glm52Config, cos: Array, sin: Array, w: IndexerWeights) -> None:
        self.ops, self.slot, self.w = ops, slot, w
        self.cos, self.sin = cos, sin
        self.heads, self.dim = cfg.index_n_heads, cfg.index_head_dim
        self.topk, self.interleave = cfg.index_topk, cfg.indexer_rope_interleave

    def write_keys(self, x: Array, q_resid: Array, batch: ForwardBatch, state: StatePools) -> Array:
        """Write the step's keys to the cache; returns the rotated queries [T, Hi, Di]."""
        ops, w = self.ops, self.w
        q = ops.linear(q_resid, w.wq_b).reshape(x.shape[0], self.heads, self.dim)
        return ops.glm52_indexer_rope_write(q, ops.linear(x, w.wk), w.k_norm_w, w.k_norm_b, batch.positions,
                                            self.cos, self.sin, self.cache(state), batch.slot_mapping, self.interleave)

    def select(self, q: Array, x: Array, batch: ForwardBatch, state: StatePools) -> Array:
        """Each query's selected key positions [T, index_topk] int32 (ops.glm52_indexer_topk)."""
        weights = self.ops.router_logits(x, self.w.weights_proj) * np.float32(self.heads ** -0.5)
        return self.ops.glm52_indexer_topk(q, weights, self.cache(state), batch, self.topk, self.dim ** -0.5)

    def cache(self, state: StatePools) -> Array:
        return state.layer(STATE_GROUP, "key", self.slot)
