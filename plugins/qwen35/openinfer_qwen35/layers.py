"""Qwen3.5's two token mixers, written against the op registry: Gated DeltaNet (linear attention
with a bounded recurrent state) and gated full attention (core GQA with an output gate)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from openinfer.plugin_api import Array, ForwardBatch, GQAAttention, Ops, StatePools

from .config import Qwen35Config

GDN_GROUP = "gdn"   # the "slots" state group: part "conv" [K-1, C] and "ssm" [nv, dk, dv] per layer


@dataclass
class GDNWeights:
    in_proj: Array     # [C + nv·dv + 2·nv, H]: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a fused at load
    conv: Array        # [C, K] depthwise causal conv (no bias)
    A_log: Array       # [nv] float32
    dt_bias: Array     # [nv] float32
    norm: Array        # [dv] plain RMSNorm weight of the gated output norm
    out_proj: Array    # [H, nv·dv]


class GatedDeltaNet:
    def __init__(self, ops: Ops, cfg: Qwen35Config, index: int, w: GDNWeights,
                 zeros: Callable[[tuple[int, ...]], Array]) -> None:
        self.ops, self.index, self.w = ops, index, w    # index: among the linear-attention layers
        self.zeros = zeros                              # the backend's, for a mixed step's output
        self.nk, self.nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.conv_dim, self.eps = cfg.conv_dim, cfg.rms_norm_eps

    def __call__(self, x: Array, batch: ForwardBatch, state: StatePools) -> Array:
        T, nv, dv = x.shape[0], self.nv, self.dv
        proj = self.ops.linear(x, self.w.in_proj)
        parts = batch.one_token_split
        if parts is not None:   # a mixed step: its decoding rows on the one-token kernels, as a decode step runs
            # them; its prompts chunked (a one-token run in the chunked kernels costs a whole chunk's work)
            head, tail = parts
            t = head.num_tokens
            o = self.zeros((T, nv, dv))
            o[:t] = self._mix(proj[:t], head, state)
            o[t:] = self._mix(proj[t:], tail, state)
        else:
            o = self._mix(proj, batch, state)
        return self.ops.linear(o.reshape(T, nv * dv), self.w.out_proj)

    def _mix(self, proj: Array, batch: ForwardBatch, state: StatePools) -> Array:
        """o [T, nv, dv] (after the gated output norm) of the fused input projection's rows for `batch`: the
        one-token ops where every run is one token, the chunked ones otherwise."""
        ops, T = self.ops, proj.shape[0]
        nk, nv, dk, dv, C = self.nk, self.nv, self.dk, self.dv, self.conv_dim
        z = proj[:, C:C + nv * dv].reshape(T, nv, dv)
        b, a = proj[:, C + nv * dv:C + nv * dv + nv], proj[:, C + nv * dv + nv:]
        conv_state = state.layer(GDN_GROUP, "conv", self.index)
        ssm_state = state.layer(GDN_GROUP, "ssm", self.index)
        decode = batch.is_decode      # every run is one token: the batched one-step ops
        conv = (ops.qwen35_causal_conv1d_update if decode else ops.qwen35_causal_conv1d)(
            proj[:, :C], self.w.conv, conv_state, batch)
        q = conv[:, :nk * dk].reshape(T, nk, dk)
        k = conv[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)
        v = conv[:, 2 * nk * dk:].reshape(T, nv, dv)
        if decode:   # the step computes its gating and the output norm too (one launch a layer on GPUs)
            return ops.qwen35_gdn_decode_norm(q, k, v, a, b, self.w.A_log, self.w.dt_bias, ssm_state, batch, z,
                                              self.w.norm, self.eps)
        g, beta = ops.qwen35_gdn_gating(a, b, self.w.A_log, self.w.dt_bias)
        return ops.qwen35_gated_rms_norm(ops.qwen35_gated_delta_rule(q, k, v, g, beta, ssm_state, batch), z,
                                         self.w.norm, self.eps)


class GatedAttention(GQAAttention):
    """Full attention with QK-norm, partial RoPE (the cos/sin tables cover rotary_dim < head_dim)
    and a per-head output gate. `w.qkv` is fused as [q | k | v | gate] rows: the checkpoint's
    q_proj interleaves [q_h | gate_h] per head and is split at load."""

    def __call__(self, x: Array, batch: ForwardBatch, state: StatePools) -> Array:
        ops, T, nh, nkv, d = self.ops, x.shape[0], self.nh, self.nkv, self.d
        qkvg = ops.linear(x, self.w.qkv)
        q = qkvg[:, :nh * d].reshape(T, nh, d)
        k = qkvg[:, nh * d:(nh + nkv) * d].reshape(T, nkv, d)
        v = qkvg[:, (nh + nkv) * d:(nh + 2 * nkv) * d].reshape(T, nkv, d)
        o = self.attend(q, k, v, batch, state).reshape(T, nh * d)
        return ops.linear(ops.qwen35_sigmoid_gate(o, qkvg[:, (nh + 2 * nkv) * d:]), self.w.o)
