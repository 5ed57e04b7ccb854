"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, GLM-5), written against the op registry.

Per token: q = q_proj(x) or, with q-LoRA, q_b_proj(RMSNorm(q_a_proj(x))), viewed [H, dn + P] as
[q_nope | q_pe]; kv_a_proj_with_mqa(x) = [c | k_pe] with c = RMSNorm(c) of width R and k_pe ONE rotary
head shared by all query heads. The two projections of x (q_proj or q_a_proj, and kv_a_proj_with_mqa) are
fused into one Linear at load, so a step runs one GEMM (GEMV at decode) for both. The paged cache ("mla" group,
part "latent") keeps R + P values per token per layer: c then the rotated k_pe, so prefix caching and offload move
it like any paged KV. One op (mla_rope_write) normalises c, rotates q_pe and k_pe and writes the cache row.

Attention runs in the absorbed form for every step (decode, prefill chunks, prefix hits): the query's
nope part is multiplied by W_UK (kv_b_proj's key rows) into the latent space, attention is taken over
the latents (mla_attention), and W_UV (kv_b_proj's value rows) maps the result back per head before
o_proj. kv_b_proj is split at load: W_UK transposed [H, R, dn], W_UV [H, dv, R] (per_head_linear's layout).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.batch import Array, ForwardBatch
from ..kernels.registry import Ops
from ..kv.pool import StatePools
from ..contract.model_line import StateGroup
from ..quant import QuantScheme
from ..quant.scheme import host_linear
from .quant_linear import load_fused, load_linear
from .rope import RopeConfig, yarn_mscale

# q_a_layernorm and kv_a_layernorm are built without the config's eps in every reference implementation
LATENT_NORM_EPS = 1e-6
STATE_GROUP = "mla"


@dataclass(frozen=True)
class MLADims:
    hidden_size: int
    num_heads: int
    q_lora_rank: int | None      # None: a plain q_proj
    kv_lora_rank: int            # R
    qk_nope_head_dim: int        # dn
    qk_rope_head_dim: int        # P
    v_head_dim: int              # dv

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


def mla_state_group(dims: MLADims, num_layers: int) -> StateGroup:
    """The paged latent cache: R + P values per token per layer."""
    return StateGroup(STATE_GROUP, "paged", num_layers, {"latent": (dims.latent_dim,)})


def mla_softmax_scale(dims: MLADims, rope: RopeConfig) -> float:
    """(dn + P)^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN when mscale_all_dim is set."""
    scale = dims.qk_head_dim ** -0.5
    if rope.kind == "yarn" and rope.mscale_all_dim:
        scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2
    return scale


def mla_weight_shapes(prefix: str, dims: MLADims, scheme: QuantScheme | None = None) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes of one MLA block under `prefix` (e.g. "model.layers.0.self_attn."), its
    Linears in `scheme`'s formats (dense by default)."""
    D, H, R, P = dims.hidden_size, dims.num_heads, dims.kv_lora_rank, dims.qk_rope_head_dim
    scheme = scheme or QuantScheme()
    shapes: dict[str, tuple[int, ...]] = {}
    if dims.q_lora_rank is None:
        shapes.update(scheme.linear_shapes(prefix + "q_proj", H * dims.qk_head_dim, D))
    else:
        shapes.update(scheme.linear_shapes(prefix + "q_a_proj", dims.q_lora_rank, D))
        shapes[prefix + "q_a_layernorm.weight"] = (dims.q_lora_rank,)
        shapes.update(scheme.linear_shapes(prefix + "q_b_proj", H * dims.qk_head_dim, dims.q_lora_rank))
    shapes.update(scheme.linear_shapes(prefix + "kv_a_proj_with_mqa", R + P, D))
    shapes[prefix + "kv_a_layernorm.weight"] = (R,)
    shapes.update(scheme.linear_shapes(prefix + "kv_b_proj", H * (dims.qk_nope_head_dim + dims.v_head_dim), R))
    shapes.update(scheme.linear_shapes(prefix + "o_proj", D, H * dims.v_head_dim))
    return shapes


@dataclass
class MLAWeights:
    x_proj: list[Array]       # [Q + R + P, D]: q_proj (Q = H (dn + P)) or q_a_proj (Q = q_lora) and
                              # kv_a_proj_with_mqa fused; the two apart where their storage formats differ
    q_a_norm: Array | None    # [q_lora]
    q_b: Array | None         # [H (dn + P), q_lora]
    kv_a_norm: Array          # [R]
    w_uk_t: Array             # [H, R, dn]: the query absorbs it (q_latent = W_UK^T q_nope per head)
    w_uv: Array               # [H, dv, R]
    o: Array                  # [D, H dv]


def load_mla_weights(backend: Any, weights: Any, prefix: str, dims: MLADims,
                     scheme: QuantScheme | None = None) -> MLAWeights:
    """One layer's MLA weights, its Linears in `scheme`'s formats (quant_linear.QuantOps runs them); kv_b_proj is
    dequantized at load, as it is split into the per-head W_UK and W_UV."""
    H, dn, dv, R = dims.num_heads, dims.qk_nope_head_dim, dims.v_head_dim, dims.kv_lora_rank
    kv_b = prefix + "kv_b_proj"
    kv_b_host = host_linear(weights, scheme, kv_b) if scheme is not None else weights.get(kv_b + ".weight")
    kv_b_w = np.asarray(kv_b_host if isinstance(kv_b_host, np.ndarray) else kv_b_host.dequant(), dtype=np.float32)
    kv_b_w = kv_b_w.reshape(H, dn + dv, R)
    lora = dims.q_lora_rank is not None

    def linear(module: str) -> Any:
        return load_linear(backend, weights, scheme, prefix + module)

    return MLAWeights(
        x_proj=load_fused(backend, weights, scheme, prefix + ("q_a_proj" if lora else "q_proj"),
                          prefix + "kv_a_proj_with_mqa"),
        q_a_norm=backend.load(weights, prefix + "q_a_layernorm.weight") if lora else None,
        q_b=linear("q_b_proj") if lora else None,
        kv_a_norm=backend.load(weights, prefix + "kv_a_layernorm.weight"),
        w_uk_t=backend.asarray(np.ascontiguousarray(kv_b_w[:, :dn, :].transpose(0, 2, 1))),
        w_uv=backend.asarray(np.ascontiguousarray(kv_b_w[:, dn:, :])),
        o=linear("o_proj"))


class MLAttention:
    """One layer's MLA; `cos`/`sin` are layers/rope.py tables over qk_rope_head_dim (YaRN's attention
    factor folded in), `scale` mla_softmax_scale."""

    def __init__(self, ops: Ops, layer: int, dims: MLADims, scale: float, cos: Array, sin: Array,
                 w: MLAWeights) -> None:
        self.ops, self.layer, self.dims = ops, layer, dims
        self.scale, self.cos, self.sin, self.w = scale, cos, sin, w

    def __call__(self, x: Array, batch: ForwardBatch, state: StatePools) -> Array:
        q_latent, q_pe, _ = self.project(x, batch, state)
        return self.output(self.ops.mla_attention(q_latent, q_pe, self.cache(state), batch, self.scale))

    def cache(self, state: StatePools) -> Array:
        """This layer's latent cache [num_blocks, block_size, R + P]."""
        return state.layer(STATE_GROUP, "latent", self.layer)

    def project(self, x: Array, batch: ForwardBatch, state: StatePools) -> tuple[Array, Array, Array | None]:
        """Write the step's latents to the cache; return the absorbed query q_latent [T, H, R], the rotated
        q_pe [T, H, P] and the normalised q-LoRA activation [T, q_lora] (None without q-LoRA), which sparse
        attention's indexer reads too."""
        ops, w, d = self.ops, self.w, self.dims
        T, H, dn = x.shape[0], d.num_heads, d.qk_nope_head_dim
        if len(w.x_proj) == 1:
            q_kv = ops.linear(x, w.x_proj[0])
            width = H * d.qk_head_dim if d.q_lora_rank is None else d.q_lora_rank
            q, kv = q_kv[:, :width], q_kv[:, width:]
        else:
            q, kv = (ops.linear(x, p) for p in w.x_proj)
        q_resid = None
        if d.q_lora_rank is not None:
            q_resid = ops.rms_norm(q, w.q_a_norm, LATENT_NORM_EPS)
            q = ops.linear(q_resid, w.q_b)
        q = q.reshape(T, H, d.qk_head_dim)
        q_pe = ops.mla_rope_write(q[:, :, dn:], kv, w.kv_a_norm, LATENT_NORM_EPS, batch.positions, self.cos,
                                  self.sin, self.cache(state), batch.slot_mapping)
        return ops.per_head_linear(q[:, :, :dn], w.w_uk_t), q_pe, q_resid

    def output(self, attn: Array) -> Array:
        """The attention's latent output [T, H, R] through W_UV and o_proj: [T, D]."""
        T, d = attn.shape[0], self.dims
        out = self.ops.per_head_linear(attn, self.w.w_uv)
        return self.ops.linear(out.reshape(T, d.num_heads * d.v_head_dim), self.w.o)
