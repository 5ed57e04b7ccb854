"""Every CUDA op against the numpy reference on random inputs (GPU only; skipped elsewhere).

bf16 cases round the inputs to bf16 first, so both sides see identical data and only the
kernel's own rounding (fp32 accumulation, bf16 stores) is measured; f32 cases are tight.
"""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.batch import ForwardBatch
from openinfer.kernels import numpy_ops as ref
from openinfer.philox import normals
from openinfer.testing.cuda import kernel_stream, require_gpu

pytestmark = pytest.mark.cuda
cp = require_gpu()
ml_dtypes = pytest.importorskip("ml_dtypes")

from openinfer.kernels.cuda import blas, ops  # noqa: E402  (imports cupy-dependent modules)
from openinfer.kernels.cuda.random_fill import fill_normal  # noqa: E402
from test_attention_mma_emulation import shuffled_tables  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
own_stream = pytest.fixture(autouse=True)(kernel_stream)
DTYPES = {"bfloat16": (BF16, 2e-2, 2e-2), "float32": (np.dtype(np.float32), 1e-5, 1e-4)}


@pytest.fixture(params=list(DTYPES))
def dt(request):
    return DTYPES[request.param]


@pytest.fixture(params=[False, True])
def pdl(request, monkeypatch):
    """The test runs with programmatic dependent launch off, then on for every kernel (not only the
    default's small ones); the fixture's value says which."""
    from openinfer.kernels.cuda import pdl as pdl_mod
    monkeypatch.setattr(pdl_mod, "ENABLED", request.param)
    monkeypatch.setattr(pdl_mod, "KERNELS", None)
    return request.param


@pytest.fixture(autouse=True)
def arrival_counters_left_zero():
    """Every kernel that counts block arrivals (split decode attention) leaves its counters zero: a count left
    behind breaks the next launch that uses them."""
    yield
    from openinfer.kernels.cuda.module import COUNTER_PURPOSES, _counters
    cp.cuda.Device().synchronize()
    left = {purpose: np.flatnonzero(cp.asnumpy(c))[:8].tolist() for (dev, purpose), c in _counters.items()
            if dev == cp.cuda.Device().id and purpose in COUNTER_PURPOSES and c.any()}
    assert not left, f"arrival counters left non-zero (purpose: first slots): {left}"


def rnd(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def dev(x: np.ndarray, dtype) -> "cp.ndarray":
    return cp.asarray(x.astype(dtype)) if x.dtype.kind == "f" else cp.asarray(x)


def host(x) -> np.ndarray:
    return cp.asnumpy(x).astype(np.float32)


def exact(x: np.ndarray, dtype) -> np.ndarray:
    """x as the kernel sees it after storage rounding."""
    return x.astype(dtype).astype(np.float32)


def close(got, want, dt, scale=1.0):
    _, atol, rtol = dt
    np.testing.assert_allclose(host(got), want, atol=atol * scale, rtol=rtol)


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


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("d,rot", [(128, "full"), (64, "partial"), (256, "partial")])
def test_rope_write_kv_is_rope_then_write_kv(dt, norm, d, rot):
    """The fused op stores exactly what qk_norm_rope / rope + write_kv store (a strided pool layer,
    q/k/v views of one fused qkv row, a padded slot skipped) and returns the same q."""
    rng = np.random.default_rng(d)
    T, nh, nkv, max_pos, nb, layers, bs = 9, 8, 2, 64, 8, 3, 4
    half = d // 2 if rot == "full" else d // 4
    ang = np.arange(max_pos)[:, None] * (1e4 ** (-np.arange(half) / half))[None]
    cos, sin = cp.asarray(np.cos(ang).astype(np.float32)), cp.asarray(np.sin(ang).astype(np.float32))
    qkv = dev(rnd(rng, T, (nh + 2 * nkv) * d), dt[0])
    q, k, v = (qkv[:, a * d: b * d].reshape(T, -1, d) for a, b in ((0, nh), (nh, nh + nkv), (nh + nkv, nh + 2 * nkv)))
    pos = cp.asarray(rng.integers(0, max_pos, T).astype(np.int32))
    slots = rng.permutation(nb * bs)[:T].astype(np.int64)
    slots[4] = -1
    slots = cp.asarray(slots)
    w = (dev(rnd(rng, d), dt[0]), dev(rnd(rng, d), dt[0])) if norm else (None, None)
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


@pytest.mark.parametrize("m", [1, 7, 64])
def test_linear(dt, m):
    rng = np.random.default_rng(m)
    x, w = exact(rnd(rng, m, 96), dt[0]), exact(rnd(rng, 160, 96), dt[0])
    close(ops.linear(dev(x, dt[0]), dev(w, dt[0])), ref.linear(x, w), dt, scale=10)


# (N, K): odd N and a partial 16-row tile, K/8 odd, K not a multiple of 16, and Qwen3-sized shapes
# whose N is small against the SM count (split-K across CTAs, last-arriving CTA reduces)
GEMV_SHAPES = [(160, 96), (77, 200), (33, 1000), (1, 64), (2560, 4096), (1000, 2056), (6144, 2560)]


@pytest.fixture
def gemv_calls(monkeypatch):
    """Counts the calls that took the GEMV kernel path."""
    from openinfer.kernels.cuda import blas
    calls = []
    real = blas.gemv
    monkeypatch.setattr(blas, "gemv", lambda *a: (calls.append(a[0].shape), real(*a))[1])
    return calls


@pytest.mark.parametrize("n,k", GEMV_SHAPES)
@pytest.mark.parametrize("m", range(1, 9))
def test_linear_gemv(m, n, k, gemv_calls):
    rng = np.random.default_rng(1000 * m + n + k)
    x, w = exact(rnd(rng, m, k), BF16), exact(rnd(rng, n, k, scale=k ** -0.5), BF16)
    xd, wd = dev(x, BF16), dev(w, BF16)
    got = ops.linear(xd, wd)
    assert gemv_calls == [(m, k)]
    close(got, ref.linear(x, w), DTYPES["bfloat16"], scale=2)
    np.testing.assert_array_equal(host(ops.linear(xd, wd)), host(got))  # split-K sums in a fixed order


@pytest.mark.parametrize("variant", blas.GEMV_VARIANTS)
def test_gemv_kernel_variants(variant, pdl, monkeypatch, gemv_calls):
    """Every kernel variant the benchmark sweeps, eager with and without PDL, split-K and tails."""
    from openinfer.kernels.cuda import blas, pdl as pdl_mod
    monkeypatch.setattr(blas, "GEMV_VARIANT", variant)
    rng = np.random.default_rng(3)
    assert pdl_mod.enabled() == pdl
    for m, n, k in ((1, 2560, 4096), (8, 2560, 9728), (3, 77, 1000), (6, 1000, 2056)):
        x, w = exact(rnd(rng, m, k), BF16), exact(rnd(rng, n, k, scale=k ** -0.5), BF16)
        close(ops.linear(dev(x, BF16), dev(w, BF16)), ref.linear(x, w), DTYPES["bfloat16"], scale=2)
    assert len(gemv_calls) == 4


def test_linear_gemv_layouts_and_fallbacks(gemv_calls):
    rng = np.random.default_rng(7)
    dt = DTYPES["bfloat16"]
    w = exact(rnd(rng, 300, 256, scale=1 / 16), BF16)
    wd = dev(w, BF16)
    wide = exact(rnd(rng, 5, 256 + 24), BF16)
    # x a strided view (row stride 280 elements, 16-byte aligned): used in place by the GEMV
    close(ops.linear(dev(wide, BF16)[:, 8:264], wd), ref.linear(wide[:, 8:264], w), dt, scale=2)
    assert gemv_calls == [(5, 256)]
    # x [2, 3, K]: flattened to 6 rows
    x3 = exact(rnd(rng, 2, 3, 256), BF16)
    got = ops.linear(dev(x3, BF16), wd)
    assert got.shape == (2, 3, 300) and gemv_calls[-1] == (6, 256)
    close(got, ref.linear(x3.reshape(6, 256), w).reshape(2, 3, 300), dt, scale=2)
    # w a row slice of a bigger matrix (a fused weight's part): row stride 256, offset 16-byte aligned
    close(ops.linear(dev(wide[:2, :256], BF16), wd[40:200]), ref.linear(wide[:2, :256], w[40:200]), dt, scale=2)
    assert gemv_calls[-1] == (2, 256)
    n_gemv = len(gemv_calls)
    # cuBLAS fallbacks, still correct: a row stride that breaks 16-byte alignment, K % 8 != 0, M > 8
    close(ops.linear(dev(wide, BF16)[:, 3:259], wd), ref.linear(wide[:, 3:259], w), dt, scale=2)
    xk = exact(rnd(rng, 4, 100), BF16)
    wk = exact(rnd(rng, 64, 100, scale=0.1), BF16)
    close(ops.linear(dev(xk, BF16), dev(wk, BF16)), ref.linear(xk, wk), dt, scale=2)
    x9 = exact(rnd(rng, 9, 256), BF16)
    close(ops.linear(dev(x9, BF16), wd), ref.linear(x9, w), dt, scale=2)
    assert len(gemv_calls) == n_gemv


def test_gemv_tuned_splits(monkeypatch, tmp_path, gemv_kernels):
    """gemv_tune on the GPU: each shape timed once and its factor kept on disk (a second start reads it), the
    plain GEMV with the chosen factors against the reference, the SiLU one still bitwise the two ops."""
    from openinfer.kernels.cuda import blas, gemv_tune
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(blas, "gemv_split_choice", {})
    shapes = {(6144, 2560), (2560, 9728), (19456, 2560), (200, 1000)}
    got = gemv_tune.tune(shapes)
    assert (got.cached, got.timed) == (0, 4) and len(blas.gemv_split_choice) == 4
    first = dict(blas.gemv_split_choice)
    blas.gemv_split_choice.clear()
    assert gemv_tune.tune(shapes) == gemv_tune.Tuned(4, 0, got.changes) and blas.gemv_split_choice == first
    rng = np.random.default_rng(12)
    for n, k in shapes:
        for m in (1, 8):
            x, w = exact(rnd(rng, m, k), BF16), exact(rnd(rng, n, k, scale=k ** -0.5), BF16)
            xd, wd = dev(x, BF16), dev(w, BF16)
            close(ops.linear(xd, wd), ref.linear(x, w), DTYPES["bfloat16"], scale=2)
            if n % 16 == 0:
                np.testing.assert_array_equal(host(ops.linear_silu_mul(xd, wd)), host(ops.silu_mul(ops.linear(xd, wd))))
    assert "gemv_silu_bf16" in gemv_kernels


def test_gemv_graph_capture_replays(pdl):
    """A chain of GEMVs (split-K and not, M = 1 and 8) captured once, replayed on new inputs."""
    rng = np.random.default_rng(11)
    ws = [dev(rnd(rng, n, k, scale=k ** -0.5), BF16) for n, k in ((6144, 2560), (2560, 6144), (200, 2560))]
    stream = cp.cuda.Stream(non_blocking=True)

    def chain(x):
        h = ops.linear(x, ws[0])
        h = ops.linear(h, ws[1])
        return ops.linear(h, ws[2]), h

    for m in (1, 8):
        x = dev(rnd(rng, m, 2560), BF16)
        with stream:
            eager = chain(x)  # warms the pool and the split-K counters
            stream.begin_capture()
            y = chain(x)
            graph = stream.end_capture()
            outs = []
            for _ in range(2):
                x[...] = dev(rnd(rng, m, 2560), BF16)
                graph.launch(stream)
                outs.append([host(a) for a in y])
                again = chain(x)
                stream.synchronize()
                for a, b in zip(outs[-1], again):
                    np.testing.assert_array_equal(a, host(b))
        assert not np.array_equal(host(eager[0]), outs[0][0])
        h = exact(host(x), BF16) @ exact(host(ws[0]), BF16).T
        close(again[1], exact(exact(h, BF16) @ host(ws[1]).T, BF16), DTYPES["bfloat16"], scale=2)


# (N, K) for the SiLU epilogue GEMV: split-K (N = 2560 against the SM count), no split (N = 19456: Qwen3-4B's
# gate_up); the tests add a small one with K / 8 odd (13 tiles of 8 gate + 8 up rows)
FUSED_SHAPES = [(2560, 9728), (19456, 2560)]


@pytest.fixture
def gemv_kernels(monkeypatch):
    """The gemv.cu kernels launched (blas.launch_gemv's kernel names)."""
    from openinfer.kernels.cuda import blas
    names = []
    real = blas.launch_gemv
    monkeypatch.setattr(blas, "launch_gemv", lambda kernel, *a: (names.append(kernel), real(kernel, *a))[1])
    return names


def _fused_inputs(rng, m, n, k):
    return exact(rnd(rng, m, k), BF16), exact(rnd(rng, n, k, scale=k ** -0.5), BF16)


@pytest.mark.parametrize("n,k", [*FUSED_SHAPES, (208, 264)])
@pytest.mark.parametrize("m", range(1, 9))
def test_linear_silu_mul_is_bitwise_the_two_ops(m, n, k, gemv_kernels):
    rng = np.random.default_rng(100 * m + n + k)
    x, w = _fused_inputs(rng, m, n, k)
    xd, wd = dev(x, BF16), dev(w, BF16)
    got = ops.linear_silu_mul(xd, wd)
    assert gemv_kernels == ["gemv_silu_bf16"] and got.shape == (m, n // 2)
    np.testing.assert_array_equal(host(got), host(ops.silu_mul(ops.linear(xd, wd))))
    close(got, ref.linear_silu_mul(x, w), DTYPES["bfloat16"], scale=5)


@pytest.mark.parametrize("variant", blas.GEMV_VARIANTS)
def test_fused_gemv_kernel_variants(variant, pdl, monkeypatch, gemv_kernels):
    """The SiLU epilogue in every kernel variant, eager with and without PDL, split-K and not."""
    from openinfer.kernels.cuda import blas
    monkeypatch.setattr(blas, "GEMV_VARIANT", variant)
    rng = np.random.default_rng(4)
    for m, n, k in ((1, 2560, 9728), (8, 512, 4096), (3, 19456, 2560)):
        xd, wd = (dev(a, BF16) for a in _fused_inputs(rng, m, n, k))
        np.testing.assert_array_equal(host(ops.linear_silu_mul(xd, wd)), host(ops.silu_mul(ops.linear(xd, wd))))
    assert gemv_kernels.count("gemv_silu_bf16") == 3


def test_fused_gemv_graph_capture_replays(pdl, gemv_kernels):
    """An MLP (linear_silu_mul, then the split-K down projection) captured once and replayed twice on new
    inputs: each replay equals the eager ops, so the tile counters were left zero. Captured as
    cuda_graphs.py does, from a pool of the graph's own: a capture-time buffer freed into the shared pool
    would be handed to the test's next array while the graph still writes it."""
    rng = np.random.default_rng(12)
    H, I = 2560, 9728
    gate_up, down = dev(rnd(rng, 2 * I, H, scale=H ** -0.5), BF16), dev(rnd(rng, H, I, scale=I ** -0.5), BF16)
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()

    def mlp(x):
        h = ops.linear_silu_mul(x, gate_up)
        return ops.linear(h, down), h

    for m in (1, 8):
        x = dev(rnd(rng, m, H), BF16)
        with stream:
            eager = host(mlp(x)[0])  # sets up the counters
            with cp.cuda.using_allocator(pool.malloc):
                stream.begin_capture()
                y = mlp(x)
                graph = stream.end_capture()
            for _ in range(2):
                x[...] = dev(rnd(rng, m, H), BF16)
                graph.launch(stream)
                got = [host(a) for a in y]
                for a, b in zip(got, mlp(x)):
                    np.testing.assert_array_equal(a, host(b))
        assert not np.array_equal(eager, got[0])
    assert "gemv_silu_bf16" in gemv_kernels


def _batch(runs, block_size, rng, num_blocks):
    """runs: (context_len, query_len) per sequence; blocks are shuffled across sequences."""
    tables = shuffled_tables([-(-L // block_size) for L, _ in runs], num_blocks, rng)
    qs = np.concatenate([[0], np.cumsum([n for _, n in runs])]).astype(np.int32)
    lens = np.array([L for L, _ in runs], np.int32)
    pos = np.concatenate([np.arange(L - n, L) for L, n in runs]).astype(np.int32)
    host_b = dict(token_ids=np.zeros(qs[-1], np.int32), positions=pos, slot_mapping=np.zeros(qs[-1], np.int64),
                  block_tables=tables, query_start=qs, context_lens=lens, sample_rows=np.zeros(0, np.int32))
    meta = dict(query_start_host=qs, context_lens_host=lens, block_size=block_size,
                max_query_len=int(np.diff(qs).max()), max_context_len=int(lens.max()))
    return (ForwardBatch(**host_b, **meta),
            ForwardBatch(**{k: cp.asarray(v) for k, v in host_b.items()}, **meta))


ATTN_CASES = {
    "prefill_varlen_prefix": ([(37, 37), (100, 30), (5, 1), (70, 64), (16, 16)], 8, 2, 128),
    "prefill_mha_d64": ([(33, 33), (90, 41)], 4, 4, 64),
    "prefill_big_group_d256": ([(40, 21), (9, 9)], 16, 1, 256),
    # bf16 prefill runs on the tensor-core kernel (64-row tiles of (token, head) rows, 64-key tiles; d256: 32)
    "prefill_long_g4_d128": ([(700, 700), (1500, 300)], 32, 8, 128),
    "prefill_long_g2_d256": ([(600, 600), (300, 100), (45, 45)], 8, 4, 256),
    "prefill_g1_partial_d64": ([(130, 130), (77, 13), (50, 0), (1, 1), (64, 64)], 4, 4, 64),
    "prefill_g8_d128": ([(200, 200), (129, 65), (8, 3)], 16, 2, 128),
    "prefill_g16_d128": ([(300, 150), (33, 33)], 16, 1, 128),
    "decode_split_kv": ([(3000, 1), (17, 1), (1, 1), (513, 1), (4100, 1)], 8, 2, 128),
    "decode_group16_d64": ([(700, 1), (129, 1)], 32, 2, 64),
    "decode_no_split": ([(60, 1)] * 40, 8, 8, 128),
    "decode_d256": ([(1000, 1), (3, 1)], 8, 2, 256),
}


@pytest.mark.parametrize("wgmma", [True, False])   # d128 bf16 prefill: the wgmma kernel (default on sm_90) or mma
@pytest.mark.parametrize("case", list(ATTN_CASES))
def test_paged_attention(dt, case, wgmma, monkeypatch):
    from openinfer.kernels.cuda import attention
    monkeypatch.setattr(attention, "PREFILL_WGMMA", wgmma)
    runs, nh, nkv, d = ATTN_CASES[case]
    rng = np.random.default_rng(len(case))
    bs, layers = 16, 2
    num_blocks = sum(-(-L // bs) for L, _ in runs) + 3
    hb, db = _batch(runs, bs, rng, num_blocks)
    T = int(hb.query_start_host[-1])
    pool = exact(rnd(rng, 2, num_blocks, layers, bs, nkv, d), dt[0])
    pool_d = dev(pool, dt[0])
    q = exact(rnd(rng, T, nh, d), dt[0])
    scale = d ** -0.5
    want = ref.paged_attention(q, pool[0][:, 1], pool[1][:, 1], hb, scale)
    got = ops.paged_attention(dev(q, dt[0]), pool_d[0][:, 1], pool_d[1][:, 1], db, scale)
    close(got, want, dt)


def _prefill_inputs(dt, runs, nh, nkv, d, seed, q_offset=0):
    """A prefill batch whose q is a strided view of a fused qkv-like buffer (as the model passes it),
    starting q_offset elements into each row (2: not 16-byte aligned, so the mma kernel is skipped)."""
    rng = np.random.default_rng(seed)
    bs, layers = 16, 3
    num_blocks = sum(-(-L // bs) for L, _ in runs) + 3
    hb, db = _batch(runs, bs, rng, num_blocks)
    T = int(hb.query_start_host[-1])
    pool = exact(rnd(rng, 2, num_blocks, layers, bs, nkv, d), dt[0])
    wide = exact(rnd(rng, T, (nh + 2 * nkv) * d + q_offset), dt[0])
    q = wide[:, q_offset: q_offset + nh * d].reshape(T, nh, d)
    qd = dev(wide, dt[0])[:, q_offset: q_offset + nh * d].reshape(T, nh, d)
    want = ref.paged_attention(q, pool[0][:, 2], pool[1][:, 2], hb, d ** -0.5)
    pool_d = dev(pool, dt[0])
    return qd, pool_d[0][:, 2], pool_d[1][:, 2], db, want


@pytest.mark.parametrize("q_offset", [0, 2])
def test_prefill_attention_strided_q(dt, q_offset):
    qd, kc, vc, db, want = _prefill_inputs(dt, [(300, 200), (90, 90)], 16, 4, 128, 12, q_offset)
    close(ops.paged_attention(qd, kc, vc, db, 128 ** -0.5), want, dt)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_prefill_attention_one_mtile_variant(monkeypatch, d):
    """The one-m-tile-per-warp mma kernels (kept for A/B timings) agree with the reference too."""
    from openinfer.kernels.cuda import attention
    monkeypatch.setattr(attention, "MMA_VARIANT", "_m1")
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _prefill_inputs(dt, [(300, 200), (90, 90), (7, 2)], 16, 4, d, 14)
    close(ops.paged_attention(qd, kc, vc, db, d ** -0.5), want, dt)


WGMMA_CASES = {
    # runs (context_len, query_len), nh, nkv (head dim 128): prefix hits, lengths off the 128-row and
    # 128-key tiles, an empty run, Qwen3-4B's 32 / 8 heads
    "varlen_prefix_g4": ([(37, 37), (100, 30), (5, 1), (70, 64), (50, 0), (16, 16)], 8, 2),
    "long_32_8": ([(1500, 1500), (2100, 700), (300, 129)], 32, 8),
    "mha_partial": ([(190, 41), (65, 65), (1, 1)], 4, 4),
    "g8": ([(200, 200), (129, 65), (8, 3)], 16, 2),
    "g16": ([(300, 150), (33, 33)], 16, 1),
}


@pytest.fixture
def wgmma_on(monkeypatch):
    """Turns OPENINFER_PREFILL_WGMMA on (Hopper only); returns the names of the attention kernels launched."""
    from openinfer.kernels.cuda import attention
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the wgmma prefill kernel needs sm_90")
    names = []
    real = attention.launch
    monkeypatch.setattr(attention, "launch", lambda src, name, *a: (names.append(name), real(src, name, *a)))
    monkeypatch.setattr(attention, "PREFILL_WGMMA", True)
    return names


@pytest.mark.parametrize("tiles", ["", "_n64", "_nostagger", "_ov", "_n64ov"])
@pytest.mark.parametrize("case", list(WGMMA_CASES))
def test_prefill_attention_wgmma(wgmma_on, monkeypatch, case, tiles):
    """The wgmma prefill kernel against the reference and against the mma kernel."""
    from openinfer.kernels.cuda import attention
    runs, nh, nkv = WGMMA_CASES[case]
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _prefill_inputs(dt, runs, nh, nkv, 128, 15)
    monkeypatch.setattr(attention, "WGMMA_VARIANT", tiles)
    got = host(ops.paged_attention(qd, kc, vc, db, 128 ** -0.5))
    monkeypatch.setattr(attention, "PREFILL_WGMMA", False)
    mma = ops.paged_attention(qd, kc, vc, db, 128 ** -0.5)
    assert wgmma_on == [f"paged_prefill_wgmma_bf16_d128{tiles}", "paged_prefill_mma_bf16_d128"]
    close(got, want, dt)
    close(mma, got, dt)


def test_prefill_attention_wgmma_graph_capture(wgmma_on):
    """The wgmma prefill kernel captures into a CUDA graph and replays like eager."""
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _prefill_inputs(dt, [(260, 130), (70, 70)], 32, 8, 128, 16)
    _assert_graph_replays_eager(dt, qd, kc, vc, db, want)
    assert set(wgmma_on) == {"paged_prefill_wgmma_bf16_d128"}


def _assert_graph_replays_eager(dt, qd, kc, vc, db, want) -> None:
    """paged_attention (head_dim 128) captured into a CUDA graph: a replay writes what eager computed."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        eager = ops.paged_attention(qd, kc, vc, db, 128 ** -0.5)
        stream.begin_capture()
        got = ops.paged_attention(qd, kc, vc, db, 128 ** -0.5)
        graph = stream.end_capture()
        got[...] = 0
        graph.launch(stream)
        stream.synchronize()
    close(got, want, dt)
    np.testing.assert_array_equal(host(got), host(eager))


def test_prefill_attention_graph_capture(dt):
    """The prefill path (the mma kernel for bf16) captures into a CUDA graph and replays like eager."""
    qd, kc, vc, db, want = _prefill_inputs(dt, [(260, 130), (70, 70)], 8, 2, 128, 13)
    _assert_graph_replays_eager(dt, qd, kc, vc, db, want)


def test_decode_splits_cover_long_contexts():
    from openinfer.kernels.cuda.attention_decode import DEC_PASS, MIN_SPLIT, decode_splits
    assert 1 < decode_splits(1, 8, 4100) <= -(-4100 // MIN_SPLIT)
    assert decode_splits(64, 8, 100) == 1
    assert decode_splits(128, 8, 20480, DEC_PASS, 2) == 1   # batch x KV heads fill the SMs alone
    assert decode_splits(1, 8, 20480, DEC_PASS, 2) == decode_splits(1, 8, 20480) > 8


# decode over ragged contexts (1 .. 20k keys, block size 16): GQA ratios 1/4/8/16, head dims 64/128/256
DECODE_CASES = {
    "qwen3_4b_g4_d128": ([1024, 1, 17, 20000, 333, 4096, 16, 15], 32, 8, 128),
    "mha_g1_d64": ([5000, 1, 64, 65, 129], 4, 4, 64),
    "g8_d256": ([2048, 3, 700], 16, 2, 256),
    "g8_d128_long": ([12000, 31], 8, 1, 128),
    "g16_d128": ([900, 2], 16, 1, 128),
    "g4_d64_tiny": ([1, 2, 3, 4, 100], 8, 2, 64),
}


def _decode_inputs(dt, ctx, nh, nkv, d, seed):
    rng = np.random.default_rng(seed)
    bs, layers = 16, 2
    num_blocks = sum(-(-L // bs) for L in ctx) + 3
    hb, db = _batch([(L, 1) for L in ctx], bs, rng, num_blocks)
    pool = exact(rnd(rng, 2, num_blocks, layers, bs, nkv, d), dt[0])
    q = exact(rnd(rng, len(ctx), nh, d), dt[0])
    want = ref.paged_attention(q, pool[0][:, 1], pool[1][:, 1], hb, d ** -0.5)
    pool_d = dev(pool, dt[0])
    return dev(q, dt[0]), pool_d[0][:, 1], pool_d[1][:, 1], db, want


# decode kernels: the tensor-core one with its splits in clusters of up to 8 (the default) or without
# clusters (OPENINFER_DECODE_CLUSTER=1), and the fp32 CUDA-core one
DECODE_KERNELS = ["mma", "mma_nocluster", "fp32"]


def _use_decode_kernel(kernel, monkeypatch):
    from openinfer.kernels.cuda import attention, attention_decode
    monkeypatch.setattr(attention, "DECODE_MMA", kernel != "fp32")
    monkeypatch.setattr(attention_decode, "DECODE_CLUSTER", 1 if kernel == "mma_nocluster" else 8)


@pytest.mark.parametrize("kernel", DECODE_KERNELS)
@pytest.mark.parametrize("graph_width", [False, True])
@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_decode_attention(dt, case, graph_width, kernel, monkeypatch):
    """Both decode kernels (bf16: the tensor-core one unless OPENINFER_DECODE_MMA=0, in clusters or not;
    float32: the fp32 one) against the reference, with the grid sized for this batch or, as a CUDA graph
    sizes it, for a 20480-token context (most splits then empty; each sequence splits its own length)."""
    import dataclasses

    if kernel != "fp32" and dt[0] != BF16:
        pytest.skip("the tensor-core decode kernel is bf16 only")
    _use_decode_kernel(kernel, monkeypatch)
    ctx, nh, nkv, d = DECODE_CASES[case]
    qd, kc, vc, db, want = _decode_inputs(dt, ctx, nh, nkv, d, len(case))
    if graph_width:
        db = dataclasses.replace(db, max_context_len=20480)
    close(ops.paged_attention(qd, kc, vc, db, d ** -0.5), want, dt)


def test_decode_attention_graph_capture():
    """The bf16 decode path (tensor-core kernel, splits merged in it) captures into a CUDA graph and
    replays like eager."""
    import dataclasses
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _decode_inputs(dt, [3000, 1, 40, 17], 32, 8, 128, 21)
    db = dataclasses.replace(db, max_context_len=20480)
    _assert_graph_replays_eager(dt, qd, kc, vc, db, want)


@pytest.fixture
def decode_grids(monkeypatch):
    """The grids of the decode attention launches (split, head chunks, sequences), as launched."""
    from openinfer.kernels.cuda import attention_decode
    grids = []
    real = attention_decode.launch
    monkeypatch.setattr(attention_decode, "launch", lambda src, name, grid, *a, **k: (grids.append(grid),
                                                                                      real(src, name, grid, *a, **k)))
    return grids


def _counters_zero() -> bool:
    from openinfer.kernels.cuda.module import arrival_counters
    return not arrival_counters("decode_attention").any()


@pytest.mark.parametrize("kernel", DECODE_KERNELS)
def test_split_decode_is_deterministic(kernel, decode_grids, monkeypatch):
    """The merging block is whichever split (cluster) finished last, a race; the merge sums in split order, so
    repeated runs give the same bits, and every run leaves the arrival counters zero."""
    import dataclasses

    _use_decode_kernel(kernel, monkeypatch)
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _decode_inputs(dt, [20000, 1, 333, 4096, 15], 32, 8, 128, 23)
    db = dataclasses.replace(db, max_context_len=20480)   # most splits of the short contexts empty
    first = host(ops.paged_attention(qd, kc, vc, db, 128 ** -0.5))
    close(first, want, dt)
    for _ in range(5):
        np.testing.assert_array_equal(host(ops.paged_attention(qd, kc, vc, db, 128 ** -0.5)), first)
    assert all(g[0] > 1 for g in decode_grids), decode_grids
    assert _counters_zero()


@pytest.mark.parametrize("kernel", DECODE_KERNELS)
def test_split_decode_with_a_no_query_sequence(dt, kernel, decode_grids, monkeypatch):
    """A sequence without a query this step (query_start repeats): all its blocks leave before counting,
    the others merge as usual, and the next launch still finds the counters zero."""
    import dataclasses

    if kernel != "fp32" and dt[0] != BF16:
        pytest.skip("the tensor-core decode kernel is bf16 only")
    _use_decode_kernel(kernel, monkeypatch)
    rng = np.random.default_rng(24)
    runs, nh, nkv, d, bs = [(3000, 1), (2000, 0), (700, 1), (5, 0), (64, 1)], 16, 4, 64, 16
    num_blocks = sum(-(-L // bs) for L, _ in runs) + 3
    hb, db = _batch(runs, bs, rng, num_blocks)
    db = dataclasses.replace(db, max_context_len=20480)
    pool = exact(rnd(rng, 2, num_blocks, 1, bs, nkv, d), dt[0])
    q = exact(rnd(rng, 3, nh, d), dt[0])
    want = ref.paged_attention(q, pool[0][:, 0], pool[1][:, 0], hb, d ** -0.5)
    pool_d, qd = dev(pool, dt[0]), dev(q, dt[0])
    for _ in range(2):
        close(ops.paged_attention(qd, pool_d[0][:, 0], pool_d[1][:, 0], db, d ** -0.5), want, dt)
        assert _counters_zero()
    assert decode_grids[0][0] > 1 and decode_grids[0][2] == len(runs), decode_grids


@pytest.mark.parametrize("kernel", DECODE_KERNELS)
@pytest.mark.parametrize("keys", [64, 128, 256, 1024])
def test_split_decode_with_longer_splits(kernel, keys, decode_grids, monkeypatch):
    """OPENINFER_DECODE_SPLIT_KEYS: each context is cut into splits of at least `keys` keys, the grid's
    other splits leave without counting; the merge waits for the used ones only. Against the reference,
    the same bits on a rerun, the counters left zero, in a grid sized for 20480 keys."""
    import dataclasses

    from openinfer.kernels.cuda import attention_decode
    _use_decode_kernel(kernel, monkeypatch)
    monkeypatch.setattr(attention_decode, "DECODE_SPLIT_KEYS", keys)
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _decode_inputs(dt, [20000, 1, 1024, 333, 4097, 64, 65], 32, 8, 128, 26)
    db = dataclasses.replace(db, max_context_len=20480)
    first = host(ops.paged_attention(qd, kc, vc, db, 128 ** -0.5))
    close(first, want, dt)
    np.testing.assert_array_equal(host(ops.paged_attention(qd, kc, vc, db, 128 ** -0.5)), first)
    assert _counters_zero()
    assert decode_grids[0][0] > 1, decode_grids


def test_split_decode_graph_replays_twice(decode_grids):
    """Captured split decode replayed twice in a row, its output zeroed before each replay: a replay
    merges only if the previous one left its counters zero."""
    import dataclasses
    dt = DTYPES["bfloat16"]
    qd, kc, vc, db, want = _decode_inputs(dt, [9000, 2, 600], 32, 8, 128, 25)
    db = dataclasses.replace(db, max_context_len=20480)
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()   # the graph's own pool, as in
    with stream:                                                                # cuda_graphs.py
        eager = host(ops.paged_attention(qd, kc, vc, db, 128 ** -0.5))
        with cp.cuda.using_allocator(pool.malloc):
            stream.begin_capture()
            got = ops.paged_attention(qd, kc, vc, db, 128 ** -0.5)
            graph = stream.end_capture()
        for _ in range(2):
            got[...] = 0
            graph.launch(stream)
            stream.synchronize()
            np.testing.assert_array_equal(host(got), eager)
            assert _counters_zero()
    close(eager, want, dt)
    assert decode_grids[1][0] > 1, decode_grids   # the captured launch splits


def test_argmax_and_top_logprobs(dt):
    rng = np.random.default_rng(4)
    S, V, k = 5, 10007, 7  # several first-stage chunks per row
    logits = exact(rnd(rng, S, V, scale=4), dt[0])
    logits[2, [9000, 10, 5000]] = logits[2].max() + 1  # ties across chunks: the lowest index wins
    logits[3, 4096:8192] = -np.inf                      # a fully masked chunk
    ld = dev(logits, dt[0])
    np.testing.assert_array_equal(cp.asnumpy(ops.argmax(ld)), logits.argmax(axis=1))
    values, indices = ops.top_logprobs(ld, k)
    mx = logits.max(1, keepdims=True)
    lsm = logits - (mx + np.log(np.exp(logits - mx).sum(1, keepdims=True)))
    order = np.stack([np.lexsort((np.arange(V), -row))[:k] for row in logits])
    np.testing.assert_array_equal(cp.asnumpy(indices), order)
    np.testing.assert_allclose(cp.asnumpy(values), np.take_along_axis(lsm, order, 1), atol=1e-4, rtol=1e-5)


def test_graph_capture_replays_cublas_and_kernels():
    rng = np.random.default_rng(5)
    x, w, nw = (dev(rnd(rng, *s), BF16) for s in ((12, 256), (512, 256), (512,)))  # 12 rows: cuBLAS, not GEMV
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        eager = ops.rms_norm(ops.linear(x, w), nw, 1e-6)  # warms the pool and the cuBLAS handle
        stream.begin_capture()
        y = ops.rms_norm(ops.linear(x, w), nw, 1e-6)
        graph = stream.end_capture()
        x[...] = dev(rnd(rng, 12, 256), BF16)
        graph.launch(stream)
        again = ops.rms_norm(ops.linear(x, w), nw, 1e-6)
        stream.synchronize()
    assert not np.array_equal(host(eager), host(again))
    np.testing.assert_array_equal(host(y), host(again))


def test_backend_round_trip_and_memory():
    from openinfer.backends.cuda_backend import CudaBackend
    be = CudaBackend(0, "bfloat16")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    d = be.asarray(a)
    assert d.dtype == BF16 and be.asarray(a.astype(np.int32)).dtype == np.int32
    np.testing.assert_array_equal(be.to_host(d).astype(np.float32), a)
    big = rnd(np.random.default_rng(6), 3000, 2000)  # over the pinned-buffer size: direct copy
    np.testing.assert_array_equal(be.to_host(be.asarray(big, "float32")), big)
    assert be.zeros((2, 3)).dtype == BF16 and not be.to_host(be.zeros((2, 3))).astype(np.float32).any()
    m = be.memory_info()
    assert 0 < m.free <= m.total
    assert 0 < be.kv_budget_bytes(None) < m.total
    assert be.kv_budget_bytes(1 << 20) == 1 << 20


@pytest.mark.parametrize("n", [1, 7, 4096 + 3])
def test_fill_normal_matches_philox_reference(dt, n):
    key = (0x89ABCDEF, 0x1234)
    x = dev(np.full(n + 5, 9.0, np.float32), dt[0])   # the fill stops at n: the tail keeps its 9s
    fill_normal(x[:n], key, 1.0, 0.1)
    got = host(x)
    np.testing.assert_allclose(got[:n], exact(1.0 + 0.1 * normals(n, key), dt[0]), atol=dt[1] * 0.1, rtol=dt[2])
    np.testing.assert_array_equal(got[n:], 9.0)
