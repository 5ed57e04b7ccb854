"""The glm52_* DSA numpy ops on their own (the reference every CUDA kernel is tested against): paged
runs equal one unpaged computation, selections follow the causal rule and the tie rule, sparse attention
over every visible key is dense MLA attention, and the indexer equals transformers' GlmMoeDsaIndexer."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.plugin_api import ForwardBatch, RopeConfig, cos_sin
from openinfer_glm52 import ops

RNG = np.random.default_rng(0)
HI, DI, P, H, R, BS = 16, 16, 8, 4, 12, 4


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def paged_batch(runs: list[tuple[int, int]], num_blocks: int = 64) -> ForwardBatch:
    """runs: (tokens before the run, run length) per sequence; blocks scattered at random."""
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.asarray([p + n for p, n in runs], dtype=np.int32)
    width = max((L + BS - 1) // BS for L in lens)
    perm = RNG.permutation(num_blocks).astype(np.int32)
    tables = perm[: len(runs) * width].reshape(len(runs), width)
    positions = np.concatenate([np.arange(p, p + n) for p, n in runs]).astype(np.int32)
    seq = np.repeat(np.arange(len(runs)), [n for _, n in runs])
    slots = (tables[seq, positions // BS] * BS + positions % BS).astype(np.int64)
    z = np.zeros(1, dtype=np.int32)
    return ForwardBatch(z, positions, slots, tables, qs, lens, z, qs, lens, BS, max(n for _, n in runs),
                        int(lens.max()))


def write_rows(cache: np.ndarray, batch: ForwardBatch, seq: int, rows: np.ndarray) -> None:
    """Put a sequence's rows for positions 0 .. len-1 into its paged blocks."""
    for pos, row in enumerate(rows):
        cache[batch.block_tables[seq, pos // BS], pos % BS] = row


def test_rotate_half_layout_rotates_halves():
    cos, sin = cos_sin(RopeConfig(1e4, P), 64)
    x, pos = rand(5, 3, DI), np.array([0, 3, 7, 9, 60])
    c, s = cos[pos][:, None], sin[pos][:, None]
    a, b = x[..., :P // 2], x[..., P // 2:P]
    want = np.concatenate([a * c - b * s, b * c + a * s, x[..., P:]], axis=-1)
    np.testing.assert_allclose(ops._rotate(x, c, s, False), want, atol=1e-6)


def test_interleaved_layout_rotates_pairs():
    cos, sin = cos_sin(RopeConfig(1e4, P), 64)
    x, pos = rand(3, DI), np.array([1, 5, 33])
    got = ops._rotate(x, cos[pos], sin[pos], True)
    z = x[:, 0:P:2] + 1j * x[:, 1:P:2]                     # pair i as a complex number, turned by angle i
    turned = z * (cos[pos] + 1j * sin[pos])
    np.testing.assert_allclose(got[:, :P // 2], turned.real, atol=1e-6)
    np.testing.assert_allclose(got[:, P // 2:P], turned.imag, atol=1e-6)
    np.testing.assert_array_equal(got[:, P:], x[:, P:])


def test_select_topk_rules():
    s = np.array([0.5, 2.0, 0.0, 0.0, 2.0, 9.0, 0.0], np.float32)
    np.testing.assert_array_equal(ops.select_topk(s, 3, 4), [0, 1, 2, -1])          # dense: all visible keys
    np.testing.assert_array_equal(ops.select_topk(s, 5, 2), [1, 4])
    np.testing.assert_array_equal(ops.select_topk(s, 7, 4), [0, 1, 4, 5])
    np.testing.assert_array_equal(ops.select_topk(s, 7, 5), [0, 1, 2, 4, 5])       # tie at the cut: earliest
    np.testing.assert_array_equal(ops.select_topk(s, 5, 3), [0, 1, 4])             # key 5 is not visible


def test_indexer_topk_paged_runs_equal_one_unpaged_computation():
    topk, scale = 6, DI ** -0.5
    runs = [(0, 11), (9, 4), (20, 1), (0, 3)]
    b = paged_batch(runs)
    cache = rand(64, BS, DI)
    keys = [rand(p + n, DI) for p, n in runs]
    for i, k in enumerate(keys):
        write_rows(cache, b, i, k)
    T = b.num_tokens
    q, w = rand(T, HI, DI), rand(T, HI)
    got = ops.glm52_indexer_topk(q, w, cache, b, topk, scale)
    assert got.shape == (T, topk) and got.dtype == np.int32
    t = 0
    for (p, n), k in zip(runs, keys):
        for j in range(n):
            pos = p + j
            score = np.einsum("h,hl->l", w[t], np.maximum(q[t] @ k[:pos + 1].T * scale, 0))
            if pos + 1 <= topk:
                want = list(range(pos + 1)) + [-1] * (topk - pos - 1)
            else:
                want = sorted(np.argsort(-score, kind="stable")[:topk])
            assert got[t].tolist() == want, (t, pos)
            t += 1


def test_indexer_rope_write_puts_normalised_rotated_keys_at_their_slots():
    cos, sin = cos_sin(RopeConfig(8e6, P), 64)
    b = paged_batch([(3, 5), (0, 2)])
    T = b.num_tokens
    cache = np.zeros((64, 3, BS, DI), np.float32)[:, 1]      # a layer view of a state pool, as the model passes
    q, k, nw, nb = rand(T, HI, DI), rand(T, DI), rand(DI), rand(DI)
    qr = ops.glm52_indexer_rope_write(q, k, nw, nb, b.positions, cos, sin, cache, b.slot_mapping, True)
    norm = (k - k.mean(-1, keepdims=True)) / np.sqrt(k.var(-1, keepdims=True) + 1e-6) * nw + nb
    want_k = ops._rotate(norm, cos[b.positions], sin[b.positions], True)
    np.testing.assert_allclose(cache[b.slot_mapping // BS, b.slot_mapping % BS], want_k, atol=1e-5)
    np.testing.assert_allclose(qr, ops._rotate(q, cos[b.positions][:, None], sin[b.positions][:, None], True),
                               atol=1e-6)


def dense_mla(q_latent, q_pe, rows, pos, scale):
    """Plain absorbed MLA attention of one query at `pos` over rows 0 .. pos."""
    c, kpe = rows[:pos + 1, :R], rows[:pos + 1, R:]
    s = (q_latent @ c.T + q_pe @ kpe.T) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ c


def test_sparse_attention_over_every_visible_key_is_dense_mla():
    runs, scale = [(0, 7), (5, 3), (12, 1)], 0.3
    b = paged_batch(runs)
    cache = rand(64, BS, R + P)
    rows = [rand(p + n, R + P) for p, n in runs]
    for i, r in enumerate(rows):
        write_rows(cache, b, i, r)
    T = b.num_tokens
    ql, qp = rand(T, H, R), rand(T, H, P)
    sel = ops.glm52_indexer_topk(rand(T, HI, DI), rand(T, HI), rand(64, BS, DI), b, 16, 1.0)  # 16 >= every length
    got = ops.glm52_sparse_mla_attention(ql, qp, cache, sel, b, scale)
    t = 0
    for (p, n), r in zip(runs, rows):
        for j in range(n):
            np.testing.assert_allclose(got[t], dense_mla(ql[t], qp[t], r, p + j, scale), rtol=1e-5, atol=1e-6)
            t += 1


def test_sparse_attention_reads_only_the_selection():
    b = paged_batch([(10, 2)])
    cache = rand(64, BS, R + P)
    rows = rand(12, R + P)
    write_rows(cache, b, 0, rows)
    ql, qp = rand(2, H, R), rand(2, H, P)
    sel = np.array([[1, 4, 9, 11, -1], [0, 2, 3, 11, -1]], np.int32)    # row 0 sits at 10: key 11 is ignored
    got = ops.glm52_sparse_mla_attention(ql, qp, cache, sel, b, 0.5)
    for t, keep in enumerate([[1, 4, 9], [0, 2, 3, 11]]):
        s = (ql[t] @ rows[keep, :R].T + qp[t] @ rows[keep, R:].T) * 0.5
        p = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(got[t], (p / p.sum(-1, keepdims=True)) @ rows[keep, :R], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("interleave", [True, False])
def test_indexer_equals_transformers(interleave):
    """q, keys, weights and the top-k against transformers' indexer on random inputs: GLM's (GlmMoeDsaIndexer,
    interleaved RoPE) and, for the rotate-half layout, DeepSeek-V3.2's (DeepseekV32Indexer). Selections compared
    as sets on rows whose k-th and (k+1)-th scores differ (torch.topk's order among exact ties is its own)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if interleave:
        from transformers import GlmMoeDsaConfig as Config
        from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaIndexer as Indexer
        from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaRotaryEmbedding as Rotary
    else:
        from transformers import DeepseekV32Config as Config
        from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer as Indexer
        from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32RotaryEmbedding as Rotary

    S, topk, hidden, qlr = 24, 7, 32, 20
    cfg = Config(hidden_size=hidden, q_lora_rank=qlr, qk_rope_head_dim=P, index_n_heads=HI, index_head_dim=DI,
                 index_topk=topk, num_hidden_layers=1, num_attention_heads=4,
                 rope_parameters={"rope_type": "default", "rope_theta": 8e6})
    torch.manual_seed(0)
    idx = Indexer(cfg, 0).eval()
    with torch.no_grad():
        for prm in idx.parameters():
            prm.copy_(torch.randn_like(prm) * (0.3 if prm.ndim > 1 else 1.0))
    x, q_resid = torch.randn(1, S, hidden), torch.randn(1, S, qlr)
    pos = torch.arange(S)[None]
    emb = Rotary(cfg)(x, pos)
    mask = torch.full((S, S), float("-inf")).triu(1)[None]
    with torch.no_grad():
        want = idx(x, q_resid, emb, mask, pos)[0].numpy()

    sd = {k: v.detach().numpy() for k, v in idx.state_dict().items()}
    cos, sin = cos_sin(RopeConfig(8e6, P), S)
    b = paged_batch([(0, S)])
    cache = np.zeros((64, BS, DI), np.float32)
    q = (q_resid[0].numpy() @ sd["wq_b.weight"].T).reshape(S, HI, DI)
    qr = ops.glm52_indexer_rope_write(q, x[0].numpy() @ sd["wk.weight"].T, sd["k_norm.weight"], sd["k_norm.bias"],
                                      b.positions, cos, sin, cache, b.slot_mapping, interleave)
    w = (x[0].numpy() @ sd["weights_proj.weight"].T) * HI ** -0.5
    got = ops.glm52_indexer_topk(qr, w, cache, b, topk, DI ** -0.5)
    scores = ops.glm52_indexer_scores(qr, w, cache.reshape(-1, DI)[b.slot_mapping], DI ** -0.5)
    compared = 0
    for t in range(S):
        if t + 1 <= topk:
            assert set(got[t][got[t] >= 0]) == set(range(t + 1))
            continue
        srt = np.sort(scores[t, :t + 1])[::-1]
        if srt[topk - 1] - srt[topk] > 1e-5 * abs(srt[0]):
            assert set(got[t]) == set(want[t]), t
            compared += 1
    assert compared >= S - topk - 2
