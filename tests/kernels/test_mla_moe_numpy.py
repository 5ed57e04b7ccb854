"""The numpy MLA and MoE ops against straightforward reference math: interleaved RoPE as complex
multiplication, absorbed attention over the paged latents against per-head expanded attention, routing
against transformers' routers and a per-token loop, experts against a per-token loop and sharded."""
from __future__ import annotations

import math

import numpy as np
import pytest

from openinfer.engine.batch import ForwardBatch
from openinfer.kernels.numpy_mla_moe import (mla_attention, mla_rope, mla_write_latent, moe_experts, moe_route,
                                             per_head_linear, router_logits)
from openinfer.layers.mla import MLADims, mla_softmax_scale
from openinfer.layers.moe import RouterConfig
from openinfer.layers.rope import RopeConfig, cos_sin, inv_freq_and_factor, rope_config

V2_LITE_ROPE = {"rope_theta": 10000, "max_position_embeddings": 163840,
                "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                                 "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096}}


def test_mla_rope_is_complex_multiplication_of_interleaved_pairs():
    rc = rope_config(V2_LITE_ROPE, 8)
    cos, sin = cos_sin(rc, 512)
    inv, factor = inv_freq_and_factor(rc)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((5, 3, 8)).astype(np.float32), rng.standard_normal((5, 8)).astype(np.float32)
    pos = np.array([0, 1, 7, 300, 511])
    rq, rk = mla_rope(q, k, pos, cos, sin)
    rot = np.exp(1j * np.outer(pos, inv)) * factor               # [T, P/2]

    def ref(x, r):
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * r
        return np.stack([z.real, z.imag], axis=-1).reshape(x.shape)
    np.testing.assert_allclose(rq, ref(q, rot[:, None, :]), atol=2e-6)
    np.testing.assert_allclose(rk, ref(k, rot), atol=2e-6)


def test_yarn_softmax_scale_and_attention_factor_of_deepseek_v2_lite():
    rc = rope_config(V2_LITE_ROPE, 64)
    dims = MLADims(2048, 16, None, 512, 128, 64, 128)
    assert inv_freq_and_factor(rc)[1] == pytest.approx(1.0)       # mscale == mscale_all_dim
    m = 0.1 * 0.707 * math.log(40) + 1
    assert mla_softmax_scale(dims, rc) == pytest.approx(192 ** -0.5 * m * m) == pytest.approx(0.1147, abs=1e-4)
    assert mla_softmax_scale(dims, RopeConfig(10000.0, 64)) == pytest.approx(192 ** -0.5)


def _batch(runs: list[tuple[int, int]], block_size: int, num_blocks: int, rng) -> ForwardBatch:
    """runs: (query tokens, context length) per sequence; blocks handed out in a shuffled order."""
    free = list(rng.permutation(num_blocks))
    tables, slots, pos, qs = [], [], [], [0]
    width = max(-(-L // block_size) for _, L in runs)
    for n, L in runs:
        blocks = [int(free.pop()) for _ in range(-(-L // block_size))]
        tables.append(blocks + [0] * (width - len(blocks)))
        for p in range(L - n, L):
            pos.append(p)
            slots.append(blocks[p // block_size] * block_size + p % block_size)
        qs.append(qs[-1] + n)
    lens = np.array([L for _, L in runs], np.int32)
    return ForwardBatch(np.zeros(qs[-1], np.int32), np.array(pos, np.int32), np.array(slots, np.int64),
                        np.array(tables, np.int32), np.array(qs, np.int32), lens, np.arange(qs[-1], dtype=np.int32),
                        np.array(qs, np.int32), lens, block_size, max(n for n, _ in runs), int(lens.max()))


def test_absorbed_attention_over_paged_latents_equals_expanded_attention():
    """Decode, a prefill chunk after a cached prefix and a whole prompt in one batch: the absorbed path
    (q_nope W_UK, attention over [c | k_pe], then W_UV) against each head's naive K/V expansion."""
    rng = np.random.default_rng(1)
    H, R, P, dn, dv, bs = 4, 32, 8, 16, 12, 4
    runs = [(1, 9), (5, 14), (7, 7)]
    batch = _batch(runs, bs, 16, rng)
    cache = np.zeros((16, bs, R + P), np.float32)
    w_kv_b = rng.standard_normal((H, dn + dv, R)).astype(np.float32) * 0.3
    w_uk, w_uv = w_kv_b[:, :dn], w_kv_b[:, dn:]
    scale = 0.3
    # every sequence's full history of latents; the query rows are its last n tokens
    hist = [(rng.standard_normal((L, R)).astype(np.float32), rng.standard_normal((L, P)).astype(np.float32))
            for _, L in runs]
    T = sum(n for n, _ in runs)
    q_nope = rng.standard_normal((T, H, dn)).astype(np.float32)
    q_pe = rng.standard_normal((T, H, P)).astype(np.float32)
    # earlier tokens' latents were written by earlier steps; this step writes its own rows
    for (n, L), (c, kpe), table in zip(runs, hist, batch.block_tables):
        past = np.arange(L - n)
        mla_write_latent(cache, c[past], kpe[past], table[past // bs] * bs + past % bs)
    mla_write_latent(cache, np.concatenate([c[L - n:] for (n, L), (c, _) in zip(runs, hist)]),
                     np.concatenate([k[L - n:] for (n, L), (_, k) in zip(runs, hist)]), batch.slot_mapping)
    out = per_head_linear(mla_attention(per_head_linear(q_nope, w_uk.transpose(0, 2, 1).copy()), q_pe, cache,
                                        batch, scale), w_uv)
    start = 0
    for (n, L), (c, kpe) in zip(runs, hist):
        for j in range(n):
            t, visible = start + j, L - n + j + 1
            for h in range(H):
                k = np.concatenate([c[:visible] @ w_uk[h].T, kpe[:visible]], axis=1)
                v = c[:visible] @ w_uv[h].T
                s = k @ np.concatenate([q_nope[t, h], q_pe[t, h]]) * scale
                p = np.exp(s - s.max())
                np.testing.assert_allclose(out[t, h], (p / p.sum()) @ v, rtol=1e-4, atol=1e-5)
        start += n


def _ref_route(scores_row, bias_row, cfg: RouterConfig):
    """One token, written out plainly."""
    E = len(scores_row)
    choice = [s + (0.0 if bias_row is None else b) for s, b in zip(scores_row, bias_row if bias_row is not None
                                                                      else [0.0] * E)]
    size = E // cfg.n_group
    if cfg.method != "greedy" and cfg.n_group > 1:
        groups = [choice[g * size:(g + 1) * size] for g in range(cfg.n_group)]
        gscore = [max(g) if cfg.method == "group_limited_greedy" else sum(sorted(g)[-2:]) for g in groups]
        kept = sorted(range(cfg.n_group), key=lambda g: -gscore[g])[:cfg.topk_group]
        fill = 0.0 if cfg.method == "group_limited_greedy" else -math.inf
        choice = [x if e // size in kept else fill for e, x in enumerate(choice)]
    ids = sorted(range(E), key=lambda e: -choice[e])[:cfg.top_k]
    w = [scores_row[e] for e in ids]
    if cfg.norm_topk_prob:
        w = [x / (sum(w) + 1e-20) for x in w]
    return ids, [x * cfg.routed_scaling_factor for x in w]


ROUTERS = [
    RouterConfig(top_k=6, routed_scaling_factor=1.0),
    RouterConfig(top_k=3, method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=16.0),
    RouterConfig(top_k=4, scoring="sigmoid", method="noaux_tc", n_group=4, topk_group=2, norm_topk_prob=True,
                 routed_scaling_factor=2.827),
    RouterConfig(top_k=8, scoring="sigmoid", method="noaux_tc", norm_topk_prob=True, routed_scaling_factor=2.5),
]


@pytest.mark.parametrize("cfg", ROUTERS, ids=lambda c: f"{c.method}-{c.scoring}-g{c.n_group}")
def test_moe_route_against_a_per_token_loop(cfg):
    rng = np.random.default_rng(2)
    E = 16
    logits = rng.standard_normal((11, E)).astype(np.float32) * 2
    bias = rng.standard_normal(E).astype(np.float32) * 0.5 if cfg.method == "noaux_tc" else None
    ids, w = moe_route(logits, bias, cfg)
    assert ids.dtype == np.int32 and w.dtype == np.float32 and ids.shape == w.shape == (11, cfg.top_k)
    scores = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True) if cfg.scoring == "softmax"
              else 1 / (1 + np.exp(-logits.astype(np.float64))))
    for t in range(len(logits)):
        want_ids, want_w = _ref_route(list(scores[t]), None if bias is None else list(bias), cfg)
        assert sorted(ids[t]) == sorted(want_ids)
        np.testing.assert_allclose(dict(zip(ids[t], w[t]))[want_ids[0]], want_w[0], rtol=1e-5)
        np.testing.assert_allclose(sorted(w[t]), sorted(want_w), rtol=1e-5)


def test_moe_route_against_transformers_routers():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import DeepseekV2Config, DeepseekV3Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 24)).astype(np.float32)
    cases = [
        (DeepseekV2TopkRouter(DeepseekV2Config(hidden_size=24, n_routed_experts=16, num_experts_per_tok=3,
                                               topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                               routed_scaling_factor=16.0, num_attention_heads=4)),
         RouterConfig(3, "softmax", "group_limited_greedy", 4, 2, False, 16.0)),
        (DeepseekV2TopkRouter(DeepseekV2Config(hidden_size=24, n_routed_experts=16, num_experts_per_tok=6,
                                               num_attention_heads=4)), RouterConfig(6)),
        (DeepseekV3TopkRouter(DeepseekV3Config(hidden_size=24, n_routed_experts=16, num_experts_per_tok=4,
                                               n_group=4, topk_group=2, norm_topk_prob=True,
                                               routed_scaling_factor=2.827, num_attention_heads=4)),
         RouterConfig(4, "sigmoid", "noaux_tc", 4, 2, True, 2.827)),
    ]
    for router, cfg in cases:
        with torch.no_grad():
            router.weight.copy_(torch.from_numpy(rng.standard_normal((16, 24)).astype(np.float32)))
            bias = None
            if hasattr(router, "e_score_correction_bias"):
                bias = (rng.standard_normal(16) * 0.3).astype(np.float32)
                router.e_score_correction_bias.copy_(torch.from_numpy(bias))
            logits, w_ref, ids_ref = (a.numpy() for a in router(torch.from_numpy(x)))
        np.testing.assert_allclose(router_logits(x, router.weight.detach().numpy()), logits, rtol=1e-5, atol=1e-6)
        ids, w = moe_route(logits, bias, cfg)
        for t in range(len(x)):
            assert dict(zip(ids[t].tolist(), w[t])) == pytest.approx(dict(zip(ids_ref[t].tolist(), w_ref[t])),
                                                                     rel=1e-5)


def _experts(rng, E, D, I):
    return (rng.standard_normal((E, 2 * I, D)).astype(np.float32) * 0.3,
            rng.standard_normal((E, D, I)).astype(np.float32) * 0.3)


def test_moe_experts_against_a_per_token_loop_and_shards_sum_to_the_whole():
    rng = np.random.default_rng(4)
    T, D, I, E, k = 7, 16, 8, 8, 3
    x = rng.standard_normal((T, D)).astype(np.float32)
    gate_up, down = _experts(rng, E, D, I)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    w = rng.random((T, k)).astype(np.float32)
    y = moe_experts(x, gate_up, down, ids, w, 0)
    for t in range(T):
        want = np.zeros(D, np.float32)
        for e, wk in zip(ids[t], w[t]):
            g, u = gate_up[e, :I] @ x[t], gate_up[e, I:] @ x[t]
            want += wk * (down[e] @ (g / (1 + np.exp(-g)) * u))
        np.testing.assert_allclose(y[t], want, rtol=1e-5, atol=1e-6)
    # expert parallelism: ranks holding [0, 3), [3, 5), [5, 8) add up to the unsharded output
    parts = [moe_experts(x, gate_up[a:b], down[a:b], ids, w, a) for a, b in ((0, 3), (3, 5), (5, 8))]
    np.testing.assert_allclose(sum(parts), y, rtol=1e-5, atol=1e-6)
    # a shard that holds none of the selected experts contributes zeros
    only = np.zeros_like(ids)
    assert not moe_experts(x, gate_up[4:], down[4:], only, w, 4).any()
    # the shared experts' output as the addend: added to the routed sum
    shared = rng.standard_normal((T, D)).astype(np.float32)
    np.testing.assert_allclose(moe_experts(x, gate_up, down, ids, w, 0, shared), y + shared, rtol=1e-6, atol=1e-6)
