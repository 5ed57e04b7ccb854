"""Elementwise CUDA ops against the numpy reference on random inputs (GPU only; skipped elsewhere):
embedding gather, RMSNorm with the residual add, QK-norm + RoPE (and the fused RoPE + KV write), SiLU-and-multiply,
K/V writes into pages.
"""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.kernels import numpy_ops as ref
from cuda_cases import (  # noqa: F401  (the fixtures are used by name)
    BF16, DTYPES, arrival_counters_left_zero, close, cp, dev, dt, exact, host, own_stream, rnd)
from openinfer.kernels.cuda import ops

pytestmark = pytest.mark.cuda


def test_gather_and_embedding(dt):
    rng = np.random.default_rng(0)
    table = rnd(rng, 50, 24)
    ids = rng.integers(0, 50, 9).astype(np.int32)
    np.testing.assert_array_equal(host(ops.embedding(dev(table, dt[0]), cp.asarray(ids))), exact(table, dt[0])[ids])
    x = dev(rnd(rng, 7, 3, 5), dt[0])  # odd row bytes: narrow copy units
    np.testing.assert_array_equal(host(ops.gather_rows(x, np.array([6, 0, 6]))), host(x)[[6, 0, 6]])


@pytest.mark.parametrize("hidden", [64, 100, 2560])
def test_rms_norm_and_add(dt, hidden):
    rng = np.random.default_rng(hidden)
    wide = rnd(rng, 5, hidden + 8)
    x, w, res = exact(wide, dt[0])[:, :hidden], exact(rnd(rng, hidden), dt[0]), exact(rnd(rng, 5, hidden), dt[0])
    xd = dev(wide, dt[0])[:, :hidden]  # a strided view, used in place
    close(ops.rms_norm(xd, dev(w, dt[0]), 1e-6), ref.rms_norm(x, w, 1e-6), dt)
    rd = dev(res, dt[0])
    out, rd2 = ops.add_rms_norm(xd, rd, dev(w, dt[0]), 1e-6)
    want_out, want_res = ref.add_rms_norm(x, res, w, 1e-6)
    assert rd2 is rd
    close(rd, want_res, dt)
    close(out, ref.rms_norm(exact(host(rd), dt[0]), w, 1e-6), dt)
    close(out, want_out, dt, scale=2)


@pytest.mark.parametrize("rot", ["full", "partial"])
def test_rope_and_qk_norm_rope(dt, rot):
    rng = np.random.default_rng(1)
    T, nh, nkv, d, max_pos = 6, 4, 2, 128, 64
    half = d // 2 if rot == "full" else d // 4
    inv = 1e4 ** (-np.arange(half) / half)
    ang = np.arange(max_pos)[:, None] * inv[None]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    qkv = exact(rnd(rng, T, (nh + 2 * nkv) * d), dt[0])
    q, k = qkv[:, : nh * d].reshape(T, nh, d), qkv[:, nh * d: (nh + nkv) * d].reshape(T, nkv, d)
    qkv_d = dev(qkv, dt[0])
    qd, kd = qkv_d[:, : nh * d].reshape(T, nh, d), qkv_d[:, nh * d: (nh + nkv) * d].reshape(T, nkv, d)
    pos = rng.integers(0, max_pos, T).astype(np.int32)
    qw, kw = exact(rnd(rng, d), dt[0]), exact(rnd(rng, d), dt[0])
    args = (cp.asarray(pos), cp.asarray(cos), cp.asarray(sin))
    for got, want in zip(ops.rope(qd, kd, *args), ref.rope(q, k, pos, cos, sin)):
        close(got, want, dt, scale=5)
    got = ops.qk_norm_rope(qd, kd, dev(qw, dt[0]), dev(kw, dt[0]), 1e-6, *args)
    for g, w in zip(got, ref.qk_norm_rope(q, k, qw, kw, 1e-6, pos, cos, sin)):
        close(g, w, dt, scale=5)


def test_norms_with_float32_weights_beside_bfloat16():
    """Qwen3.5 folds its zero-centred norms to 1 + w in float32 at load (bf16 would round 1 + w to
    steps of 2^-7): bf16 activations with f32 weights, for the RMSNorms and the partial-rotary
    QK-norm at the real head size (256, rotary 64)."""
    dt = DTYPES["bfloat16"]
    rng = np.random.default_rng(7)
    H, T, nh, nkv, d, half = 2560, 5, 4, 2, 256, 32
    x, res = exact(rnd(rng, T, H), BF16), exact(rnd(rng, T, H), BF16)
    w = (1 + 0.05 * rnd(rng, H)).astype(np.float32)
    close(ops.rms_norm(dev(x, BF16), cp.asarray(w), 1e-6), ref.rms_norm(x, w, 1e-6), dt)
    rd = dev(res, BF16)
    out, _ = ops.add_rms_norm(dev(x, BF16), rd, cp.asarray(w), 1e-6)
    close(out, ref.rms_norm(exact(host(rd), BF16), w, 1e-6), dt)
    ang = np.arange(64)[:, None] * 1e7 ** (-np.arange(half) / half)[None]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    q, k = exact(rnd(rng, T, nh, d), BF16), exact(rnd(rng, T, nkv, d), BF16)
    qw, kw = ((1 + 0.05 * rnd(rng, d)).astype(np.float32) for _ in range(2))
    pos = rng.integers(0, 64, T).astype(np.int32)
    got = ops.qk_norm_rope(dev(q, BF16), dev(k, BF16), cp.asarray(qw), cp.asarray(kw), 1e-6, cp.asarray(pos),
                           cp.asarray(cos), cp.asarray(sin))
    for g, want in zip(got, ref.qk_norm_rope(q, k, qw, kw, 1e-6, pos, cos, sin)):
        assert g.dtype == BF16
        close(g, want, dt, scale=5)
    with pytest.raises(TypeError, match="not compiled"):
        ops.rms_norm(dev(x, np.float32), dev(w, BF16), 1e-6)


def rope_write_inputs(rng, dtype, d: int, half: int, norm: bool, big: bool = False) -> tuple:
    """(q, k, v, positions, slots, norm weights, cos, sin) of 9 tokens, 8 query and 2 KV heads of d, `half`
    rotated pairs: q/k/v views of one fused qkv row, slots in a pool of 8 blocks of 4 with token 4 padded (-1);
    big: values of 4 sigma and a few of the last v head's past e4m3's range."""
    T, nh, nkv, max_pos, nb, bs = 9, 8, 2, 64, 8, 4
    ang = np.arange(max_pos)[:, None] * (1e4 ** (-np.arange(half) / half))[None]
    cos, sin = cp.asarray(np.cos(ang).astype(np.float32)), cp.asarray(np.sin(ang).astype(np.float32))
    raw = rnd(rng, T, (nh + 2 * nkv) * d, scale=4.0 if big else 1.0)
    if big:
        raw[:, -5:] *= 400.0
    qkv = dev(raw, dtype)
    q, k, v = (qkv[:, a * d: b * d].reshape(T, -1, d) for a, b in ((0, nh), (nh, nh + nkv), (nh + nkv, nh + 2 * nkv)))
    pos = cp.asarray(rng.integers(0, max_pos, T).astype(np.int32))
    slots = rng.permutation(nb * bs)[:T].astype(np.int64)
    slots[4] = -1
    w = (dev(rnd(rng, d), dtype), dev(rnd(rng, d), dtype)) if norm else (None, None)
    return q, k, v, pos, cp.asarray(slots), w, cos, sin


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("d,rot", [(128, "full"), (64, "partial"), (256, "partial")])
def test_rope_write_kv_is_rope_then_write_kv(dt, norm, d, rot):
    """The fused op stores exactly what qk_norm_rope / rope + write_kv store (a strided pool layer,
    q/k/v views of one fused qkv row, a padded slot skipped) and returns the same q."""
    nb, layers, bs, nkv = 8, 3, 4, 2
    q, k, v, pos, slots, w, cos, sin = rope_write_inputs(np.random.default_rng(d), dt[0], d,
                                                         d // 2 if rot == "full" else d // 4, norm)
    pools = [cp.zeros((nb, layers, bs, nkv, d), dtype=dt[0]) for _ in range(4)]
    if norm:
        q_want, k_roped = ops.qk_norm_rope(q, k, *w, 1e-6, pos, cos, sin)
    else:
        q_want, k_roped = ops.rope(q, k, pos, cos, sin)
    ops.write_kv(pools[0][:, 1], pools[1][:, 1], k_roped, v, slots)
    q_got = ops.rope_write_kv(q, k, v, *w, 1e-6, pos, cos, sin, pools[2][:, 1], pools[3][:, 1], slots)
    np.testing.assert_array_equal(host(q_got), host(q_want))
    np.testing.assert_array_equal(host(pools[2]), host(pools[0]))
    np.testing.assert_array_equal(host(pools[3]), host(pools[1]))
    assert host(pools[2][:, 1]).any() and not host(pools[2][:, 0]).any()


@pytest.fixture
def rope_kernels(monkeypatch):
    """The rope.cu kernel names launched."""
    names = []
    real = ops.launch
    monkeypatch.setattr(ops, "launch", lambda source, name, *a, **k: (names.append(name),
                                                                      real(source, name, *a, **k)))
    return names


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("d,half", [(128, 64), (256, 32), (64, 16)])
def test_rope_word_variants_match_scalar(dt, norm, d, half, rope_kernels, monkeypatch):
    """rope_write_kv and qk_norm_rope in 16-byte words (_v_) store the scalar kernels' bits (the QK-norm's
    sum of squares in the scalar order), match numpy, and a qkv row stride that breaks the words takes
    the scalar kernels. T = 37: a partial last block; slot 4 padded (the word kernels are allowed at
    any size here: the engine takes them only for prefill-sized launches)."""
    monkeypatch.setattr(ops, "ROPE_WORDS_MIN_HEADS", 0)
    rng = np.random.default_rng(d + half)
    T, nh, nkv, max_pos, nb, bs = 37, 8, 2, 64, 16, 4
    W = (nh + 2 * nkv) * d
    ang = np.arange(max_pos)[:, None] * (1e4 ** (-np.arange(half) / half))[None]
    cos_h, sin_h = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    cos, sin = cp.asarray(cos_h), cp.asarray(sin_h)
    qkv_h = exact(rnd(rng, T, W, scale=2), dt[0])
    pos_h = rng.integers(0, max_pos, T).astype(np.int32)
    slots_h = rng.permutation(nb * bs)[:T].astype(np.int64)
    slots_h[4] = -1
    pos, slots = cp.asarray(pos_h), cp.asarray(slots_h)
    w_h = (exact(1 + 0.1 * rnd(rng, d), dt[0]), exact(1 + 0.1 * rnd(rng, d), dt[0])) if norm else (None, None)
    w = tuple(None if a is None else dev(a, dt[0]) for a in w_h)
    parts = ((0, nh), (nh, nh + nkv), (nh + nkv, nh + 2 * nkv))

    def run(qkv):
        q, k, v = (qkv[:, a * d: b * d].reshape(T, -1, d) for a, b in parts)
        caches = [cp.zeros((nb, bs, nkv, d), dtype=dt[0]) for _ in range(2)]
        q_out = ops.rope_write_kv(q, k, v, *w, 1e-6, pos, cos, sin, *caches, slots)
        qk = ops.qk_norm_rope(q, k, *w, 1e-6, pos, cos, sin) if norm else ops.rope(q, k, pos, cos, sin)
        return [host(a) for a in (q_out, *caches, *qk)]

    words = run(dev(qkv_h, dt[0]))
    assert rope_kernels and all("_v_" in n for n in rope_kernels), rope_kernels
    pad = 4 // dt[0].itemsize   # a row stride of 4 bytes past whole words: no _v_, and heads3d keeps the view
    wide = dev(np.pad(qkv_h, ((0, 0), (0, pad))), dt[0])[:, :W]
    scalar = run(wide)
    assert not any("_v_" in n for n in rope_kernels[2:]), rope_kernels
    for a, b in zip(words, scalar):
        np.testing.assert_array_equal(a, b)
    q, k, v = (qkv_h[:, a * d: b * d].reshape(T, -1, d) for a, b in parts)
    want_caches = [np.zeros((nb, bs, nkv, d), np.float32) for _ in range(2)]
    keep = slots_h >= 0
    want_q = ref.rope_write_kv(q[keep], k[keep], v[keep], *w_h, 1e-6, pos_h[keep], cos_h, sin_h, *want_caches,
                               slots_h[keep])
    close(words[0][keep], want_q, dt, scale=5)
    close(words[1], want_caches[0], dt, scale=5)
    np.testing.assert_array_equal(words[2], want_caches[1])


@pytest.mark.parametrize("inter", [300, 1024])   # element by element, then in 16-byte words
def test_silu_mul(dt, inter):
    rng = np.random.default_rng(2)
    x = exact(rnd(rng, 5, 2 * inter, scale=3), dt[0])
    close(ops.silu_mul(dev(x, dt[0])), ref.silu_mul(x), dt, scale=5)


def test_write_kv_into_strided_pool(dt):
    rng = np.random.default_rng(3)
    nb, layers, bs, nkv, d, T = 6, 3, 4, 2, 64, 7
    pool_k = cp.zeros((nb, layers, bs, nkv, d), dtype=dt[0])
    pool_v = cp.zeros_like(pool_k)
    kv = exact(rnd(rng, T, 2 * nkv * d), dt[0])
    k, v = kv[:, : nkv * d].reshape(T, nkv, d), kv[:, nkv * d:].reshape(T, nkv, d)
    kvd = dev(kv, dt[0])
    slots = rng.permutation(nb * bs)[:T].astype(np.int64)
    slots_dev = slots.copy()
    slots_dev[3] = -1  # padding: skipped
    ops.write_kv(pool_k[:, 1], pool_v[:, 1], kvd[:, : nkv * d].reshape(T, nkv, d), kvd[:, nkv * d:].reshape(T, nkv, d),
                 cp.asarray(slots_dev))
    want_k, want_v = np.zeros((nb, bs, nkv, d), np.float32), np.zeros((nb, bs, nkv, d), np.float32)
    keep = slots_dev >= 0
    ref.write_kv(want_k, want_v, k[keep], v[keep], slots[keep])
    np.testing.assert_array_equal(host(pool_k[:, 1]), want_k)
    np.testing.assert_array_equal(host(pool_v[:, 1]), want_v)
    assert not host(pool_k[:, 0]).any() and not host(pool_k[:, 2]).any()


@pytest.mark.parametrize("norm", [True, False])
def test_fp8_cache_writes_are_the_rounded_bf16_writes(dt, norm):
    """write_kv and rope_write_kv into e4m3 caches store e4m3(the value the model-dtype cache stores): nearest,
    ties to even, saturated at +-448 (numpy's to_e4m3); padded slots skipped; rope_write_kv's q unchanged."""
    from openinfer.quant.fp8 import to_e4m3
    nb, layers, bs, nkv, d = 8, 3, 4, 2, 128
    q, k, v, pos, slots, w, cos, sin = rope_write_inputs(np.random.default_rng(11), dt[0], d, d // 2, norm, big=True)
    wide = [cp.zeros((nb, layers, bs, nkv, d), dtype=dt[0]) for _ in range(2)]
    fp8 = [cp.zeros((nb, layers, bs, nkv, d), dtype=cp.uint8) for _ in range(4)]
    q_want = ops.rope_write_kv(q, k, v, *w, 1e-6, pos, cos, sin, wide[0][:, 1], wide[1][:, 1], slots)
    q_got = ops.rope_write_kv(q, k, v, *w, 1e-6, pos, cos, sin, fp8[0][:, 1], fp8[1][:, 1], slots)
    np.testing.assert_array_equal(host(q_got), host(q_want))
    for got, model_dtype in zip(fp8[:2], wide):
        np.testing.assert_array_equal(cp.asnumpy(got), to_e4m3(host(model_dtype)))
    ops.write_kv(fp8[2][:, 1], fp8[3][:, 1], k, v, slots)
    keep = cp.asnumpy(slots) >= 0
    stored = cp.asnumpy(fp8[3][:, 1]).reshape(nb * bs, nkv, d)[cp.asnumpy(slots)[keep]]
    np.testing.assert_array_equal(stored, to_e4m3(host(v)[keep]))
    assert (stored == 0x7E).any() or (stored == 0xFE).any()   # some saturated
    assert not cp.asnumpy(fp8[2][:, 0]).any()
