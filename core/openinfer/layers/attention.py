"""GQA self-attention over paged KV, with optional per-head QK-norm (Qwen3) — written against
the op registry so it runs on every backend."""
from __future__ import annotations

from dataclasses import dataclass
from ..engine.batch import Array, ForwardBatch
from ..kernels.registry import Ops
from ..kv.pool import StatePools


@dataclass
class AttentionWeights:
    qkv: Array            # [(nh + 2 nkv) * d, H]: q, k, v projections fused at load
    o: Array              # [H, nh * d]
    q_norm: Array | None  # [d]
    k_norm: Array | None


class GQAAttention:
    def __init__(self, ops: Ops, layer: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 eps: float, cos: Array, sin: Array, w: AttentionWeights, kv_group: str = "kv") -> None:
        self.ops, self.layer = ops, layer
        self.nh, self.nkv, self.d = num_heads, num_kv_heads, head_dim
        self.eps, self.cos, self.sin, self.w = eps, cos, sin, w
        self.kv_group = kv_group
        self.scale = head_dim ** -0.5

    def __call__(self, x: Array, batch: ForwardBatch, state: StatePools) -> Array:
        T = x.shape[0]
        qkv = self.ops.linear(x, self.w.qkv)
        q_end, k_end = self.nh * self.d, (self.nh + self.nkv) * self.d
        q = qkv[:, :q_end].reshape(T, self.nh, self.d)
        k = qkv[:, q_end:k_end].reshape(T, self.nkv, self.d)
        v = qkv[:, k_end:].reshape(T, self.nkv, self.d)
        return self.ops.linear(self.attend(q, k, v, batch, state).reshape(T, self.nh * self.d), self.w.o)

    def attend(self, q: Array, k: Array, v: Array, batch: ForwardBatch, state: StatePools) -> Array:
        """QK-norm (if any) and RoPE, write K/V to the paged cache, attend: [T, nh, d] out.
        RoPE turns the first 2 * cos.shape[1] dims of each head (partial rotary if < d). A plan with
        rope_write_kv does the first two in one op (one launch a layer on GPUs)."""
        ops = self.ops
        k_cache = state.layer(self.kv_group, "k", self.layer)
        v_cache = state.layer(self.kv_group, "v", self.layer)
        if hasattr(ops, "rope_write_kv"):
            q = ops.rope_write_kv(q, k, v, self.w.q_norm, self.w.k_norm, self.eps, batch.positions, self.cos,
                                  self.sin, k_cache, v_cache, batch.slot_mapping)
            return ops.paged_attention(q, k_cache, v_cache, batch, self.scale)
        if self.w.q_norm is not None:
            q, k = ops.qk_norm_rope(q, k, self.w.q_norm, self.w.k_norm, self.eps, batch.positions, self.cos, self.sin)
        else:
            q, k = ops.rope(q, k, batch.positions, self.cos, self.sin)
        ops.write_kv(k_cache, v_cache, k, v, batch.slot_mapping)
        return ops.paged_attention(q, k_cache, v_cache, batch, self.scale)
