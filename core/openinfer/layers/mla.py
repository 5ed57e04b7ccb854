"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, GLM-5), written against the op registry.

Per token: q = q_proj(x) or, with q-LoRA, q_b_proj(RMSNorm(q_a_proj(x))), viewed [H, dn + P] as
[q_nope | q_pe]; kv_a_proj_with_mqa(x) = [c | k_pe] with c = RMSNorm(c) of width R and k_pe ONE rotary
head shared by all query heads. The two projections of x (q_proj or q_a_proj, and kv_a_proj_with_mqa) are
fused into one Linear at load, so a step runs one GEMM (GEMV at decode) for both. The paged cache ("mla" group,
part "latent") keeps R + P values per token per layer: c then the rotated k_pe, so prefix caching and offload move
it like any paged KV. One op (mla_rope_write) normalises c, rotates q_pe and k_pe and writes the cache row.

Decode steps (every run one token; the CUDA graphs capture only those) run the absorbed form: the query's
nope part is multiplied by W_UK (kv_b_proj's key rows) into the latent space, attention is taken over
the latents (mla_attention), and W_UV (kv_b_proj's value rows) maps the result back per head before
o_proj. Steps with longer runs (prefill chunks, prefix hits, mixed steps) run those runs in the expanded form
(mla_expanded.py: the context's latents decompressed by kv_b_proj into per-head keys and values, standard
attention, o_proj) and their one-token runs absorbed; all absorbed where the expansion would not fit the step's
memory. The two forms compute the same attention (only the rounding differs). kv_b_proj is kept [H (dn + dv), R];
W_UV [H, dv, R] is a view of it and W_UK is kept transposed [H, R, dn] (per_head_linear's layout).
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
from .mla_expanded import prefill_attention
from .quant_linear import load_fused, load_linear
from .rope import RopeConfig, yarn_mscale

# q_a_layernorm and kv_a_layernorm are built without the config's eps in every reference implementation
LATENT_NORM_EPS = 1e-6
STATE_GROUP = "mla"
# what the absorbed form calls (project, the latent attention, output): a kernel plan with MLA layers names them
OPS = ("mla_rope_write", "mla_attention", "per_head_linear", "beside", "joined")


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
    kv_b: Array               # [H (dn + dv), R]: decompresses latents into k_nope and v (the expanded form)
    w_uk_t: Array             # [H, R, dn]: the query absorbs it (q_latent = W_UK^T q_nope per head)
    w_uv: Array               # [H, dv, R]: a view of kv_b
    o: Array                  # [D, H dv]


def load_mla_weights(backend: Any, weights: Any, prefix: str, dims: MLADims,
                     scheme: QuantScheme | None = None) -> MLAWeights:
    """One layer's MLA weights, its Linears in `scheme`'s formats (quant_linear.QuantOps runs them); kv_b_proj is
    dequantized at load, as the per-head W_UK and W_UV are taken from it."""
    H, dn, dv, R = dims.num_heads, dims.qk_nope_head_dim, dims.v_head_dim, dims.kv_lora_rank
    kv_b = prefix + "kv_b_proj"
    kv_b_host = host_linear(weights, scheme, kv_b) if scheme is not None else weights.get(kv_b + ".weight")
    kv_b_w = np.asarray(kv_b_host if isinstance(kv_b_host, np.ndarray) else kv_b_host.dequant(), dtype=np.float32)
    kv_b_dev = backend.asarray(kv_b_w)
    lora = dims.q_lora_rank is not None

    def linear(module: str) -> Any:
        return load_linear(backend, weights, scheme, prefix + module)

    return MLAWeights(
        x_proj=load_fused(backend, weights, scheme, prefix + ("q_a_proj" if lora else "q_proj"),
                          prefix + "kv_a_proj_with_mqa"),
        q_a_norm=backend.load(weights, prefix + "q_a_layernorm.weight") if lora else None,
        q_b=linear("q_b_proj") if lora else None,
        kv_a_norm=backend.load(weights, prefix + "kv_a_layernorm.weight"),
        kv_b=kv_b_dev,
        w_uk_t=backend.asarray(np.ascontiguousarray(kv_b_w.reshape(H, dn + dv, R)[:, :dn, :].transpose(0, 2, 1))),
        w_uv=kv_b_dev.reshape(H, dn + dv, R)[:, dn:, :],
        o=linear("o_proj"))


class MLAttention:
    """One layer's MLA; `cos`/`sin` are layers/rope.py tables over qk_rope_head_dim (YaRN's attention
    factor folded in), `scale` mla_softmax_scale."""

    def __init__(self, ops: Ops, layer: int, dims: MLADims, scale: float, cos: Array, sin: Array,
                 w: MLAWeights) -> None:
        self.ops, self.layer, self.dims = ops, layer, dims
        self.scale, self.cos, self.sin, self.w = scale, cos, sin, w

    def __call__(self, x: Array, batch: ForwardBatch, state: StatePools) -> Array:
        if batch.max_query_len == 1:
            q_latent, q_pe, _ = self.project(x, batch, state)
            return self.output(self.ops.mla_attention(q_latent, q_pe, self.cache(state), batch, self.scale))
        q_nope, q_pe, _ = self.project_heads(x, batch, state)
        return self.o_proj(prefill_attention(self.ops, self.dims, q_nope, q_pe, self.cache(state), self.w.kv_b, batch,
                                             self.scale, lambda qn, qp, b: self.absorbed(qn, qp, b, state)))

    def absorbed(self, q_nope: Array, q_pe: Array, batch: ForwardBatch, state: StatePools) -> Array:
        """Attention in the absorbed form: W_UK into the query, attention over the latents, W_UV: [T, H, dv]."""
        q_latent = self.ops.per_head_linear(q_nope, self.w.w_uk_t)
        attn = self.ops.mla_attention(q_latent, q_pe, self.cache(state), batch, self.scale)
        return self.ops.per_head_linear(attn, self.w.w_uv)

    def cache(self, state: StatePools) -> Array:
        """This layer's latent cache [num_blocks, block_size, R + P]."""
        return state.layer(STATE_GROUP, "latent", self.layer)

    def project(self, x: Array, batch: ForwardBatch, state: StatePools) -> tuple[Array, Array, Array | None]:
        """project_heads with the query absorbed: q_latent [T, H, R], q_pe, the q-LoRA activation. W_UK needs only
        the projections, so it runs `beside` the latents' write (on CUDA a side stream), joined before it returns."""
        q, kv, q_resid = self._projections(x)
        q_latent = self.ops.beside(self.ops.per_head_linear, q[:, :, :self.dims.qk_nope_head_dim], self.w.w_uk_t)
        q_pe = self._write_latents(q, kv, batch, state)
        return self.ops.joined(q_latent), q_pe, q_resid

    def project_heads(self, x: Array, batch: ForwardBatch, state: StatePools) -> tuple[Array, Array, Array | None]:
        """Write the step's latents to the cache; return q_nope [T, H, dn], the rotated q_pe [T, H, P] and the
        normalised q-LoRA activation [T, q_lora] (None without q-LoRA), which sparse attention's indexer reads too."""
        q, kv, q_resid = self._projections(x)
        return q[:, :, :self.dims.qk_nope_head_dim], self._write_latents(q, kv, batch, state), q_resid

    def _projections(self, x: Array) -> tuple[Array, Array, Array | None]:
        """q [T, H, dn + P], the compressed kv [T, R + P] and the normalised q-LoRA activation (or None)."""
        ops, w, d = self.ops, self.w, self.dims
        if len(w.x_proj) == 1:
            q_kv = ops.linear(x, w.x_proj[0])
            width = d.num_heads * d.qk_head_dim if d.q_lora_rank is None else d.q_lora_rank
            q, kv = q_kv[:, :width], q_kv[:, width:]
        else:
            q, kv = (ops.linear(x, p) for p in w.x_proj)
        q_resid = None
        if d.q_lora_rank is not None:
            q_resid = ops.rms_norm(q, w.q_a_norm, LATENT_NORM_EPS)
            q = ops.linear(q_resid, w.q_b)
        return q.reshape(x.shape[0], d.num_heads, d.qk_head_dim), kv, q_resid

    def _write_latents(self, q: Array, kv: Array, batch: ForwardBatch, state: StatePools) -> Array:
        """The latent norm, both RoPEs and the cache write (one op); returns the rotated q_pe [T, H, P]."""
        return self.ops.mla_rope_write(q[:, :, self.dims.qk_nope_head_dim:], kv, self.w.kv_a_norm, LATENT_NORM_EPS,
                                       batch.positions, self.cos, self.sin, self.cache(state), batch.slot_mapping)

    def output(self, attn: Array) -> Array:
        """The attention's latent output [T, H, R] through W_UV and o_proj: [T, D]."""
        return self.o_proj(self.ops.per_head_linear(attn, self.w.w_uv))

    def o_proj(self, out: Array) -> Array:
        """The heads' values [T, H, dv] through o_proj: [T, D]."""
        return self.ops.linear(out.reshape(out.shape[0], self.dims.num_heads * self.dims.v_head_dim), self.w.o)
