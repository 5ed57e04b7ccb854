"""skinny_gemm.cu (decode GEMMs of 1..128 rows on sm_90) against the numpy reference on random inputs (GPU only).

Shapes: Qwen3-4B's decode weights (split-K in clusters and not), a partial last tile, K past the last full stage,
every batch width, strided operands; every split factor; the SiLU epilogue bitwise the two ops; PDL on; graph capture
replaying bit for bit; the start-up tuner."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.kernels import numpy_ops as ref
from openinfer.testing.cuda import kernel_stream, require_gpu

pytestmark = pytest.mark.cuda
cp = require_gpu()
ml_dtypes = pytest.importorskip("ml_dtypes")

from openinfer.kernels.cuda import blas, ops, skinny_gemm  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
own_stream = pytest.fixture(autouse=True)(kernel_stream)
if not skinny_gemm.hopper():
    pytest.skip("the skinny GEMM is built for sm_90 (H100 / H200)", allow_module_level=True)

SHAPES = [(2560, 4096), (6144, 2560), (19456, 2560), (200, 200), (77, 1000)]


@pytest.fixture
def calls(monkeypatch):
    """The skinny GEMM on (it is off by default); records the x shapes it ran."""
    monkeypatch.setattr(skinny_gemm, "MODE", "1")
    seen = []
    real = skinny_gemm.gemm
    monkeypatch.setattr(skinny_gemm, "gemm", lambda x2, *a, **kw: (seen.append(x2.shape), real(x2, *a, **kw))[1])
    return seen


def inputs(rng, m, n, k):
    x = rng.standard_normal((m, k)).astype(BF16)
    w = (rng.standard_normal((n, k)) * k ** -0.5).astype(BF16)
    return x, w


def check(got, x, w):
    want = ref.linear(x.astype(np.float32), w.astype(np.float32))
    np.testing.assert_allclose(cp.asnumpy(got).astype(np.float32), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [9, 16, 17, 32, 40, 64, 100, 128])
def test_linear_takes_the_skinny_gemm(m, n, k, calls):
    rng = np.random.default_rng(m * 7 + n + k)
    x, w = inputs(rng, m, n, k)
    xd, wd = cp.asarray(x), cp.asarray(w)
    got = ops.linear(xd, wd)
    assert calls == [(m, k)]
    check(got, x, w)
    np.testing.assert_array_equal(cp.asnumpy(ops.linear(xd, wd)), cp.asnumpy(got))   # splits summed in rank order


@pytest.mark.parametrize("inter,k", [(9728, 2560), (1000, 4096), (200, 264)])
@pytest.mark.parametrize("m", [9, 32, 100, 128])
def test_silu_epilogue_is_bitwise_the_two_ops(m, inter, k, calls):
    """linear_silu_mul through the SILU epilogue equals silu_mul(linear) through the plain kernel bit for bit: the
    same per-row sums in the same split order, each rounded to bf16 before silu_mul."""
    rng = np.random.default_rng(m + inter + k)
    x, w = inputs(rng, m, 2 * inter, k)
    xd, wd = cp.asarray(x), cp.asarray(w)
    fused = ops.linear_silu_mul(xd, wd)
    two = ops.silu_mul(ops.linear(xd, wd))
    assert calls == [(m, k), (m, k)]
    np.testing.assert_array_equal(cp.asnumpy(fused), cp.asnumpy(two))


@pytest.mark.parametrize("m", [1, 3, 8])
def test_up_to_8_rows_where_timing_chose_it(m, calls, monkeypatch):
    """The width-8 variant in place of the GEMV (tune mode, a chosen split), plain and with the SiLU epilogue."""
    monkeypatch.setattr(skinny_gemm, "MODE", "tune")
    rng = np.random.default_rng(m)
    for n, k in [(19456, 2560), (2560, 9728), (200, 264)]:
        monkeypatch.setattr(skinny_gemm, "split_choice", {(cp.cuda.Device().id, 8, n, k): (3, 2 if n > 200 else 1)})
        x, w = inputs(rng, m, n, k)
        xd, wd = cp.asarray(x), cp.asarray(w)
        check(ops.linear(xd, wd), x, w)
        np.testing.assert_array_equal(cp.asnumpy(ops.linear_silu_mul(xd, wd)),
                                      cp.asnumpy(ops.silu_mul(ops.linear(xd, wd))))
    assert calls == [(m, k) for k in (2560, 9728, 264) for _ in range(3)]


@pytest.mark.parametrize("splits", range(1, 9))
def test_every_split_factor_and_variant(splits, calls):
    rng = np.random.default_rng(splits)
    for m, n, k in ((1, 2560, 4096), (32, 2560, 4096), (64, 19456, 2560), (128, 384, 1000)):
        x, w = inputs(rng, m, n, k)
        for per_sm in skinny_gemm.variants(skinny_gemm.width(m)):
            out = cp.empty((m, n), BF16)
            skinny_gemm.gemm(cp.asarray(x), cp.asarray(w), out, splits=splits, per_sm=per_sm)
            check(out, x, w)


def test_strided_operands_and_fallbacks(calls):
    rng = np.random.default_rng(5)
    x, w = inputs(rng, 24, 300, 256 + 24)
    xd, wd = cp.asarray(x), cp.asarray(w)
    check(ops.linear(xd[:, 8:264], wd[40:200, 8:264]), x[:, 8:264], w[40:200, 8:264])   # 16-byte strided views
    assert calls == [(24, 256)]
    check(ops.linear(xd[:, 3:259], wd[:, :256]), x[:, 3:259], w[:, :256])   # misaligned x: cuBLASLt / GemmEx
    check(ops.linear(xd[:8, :256], wd[:, :256]), x[:8, :256], w[:, :256])   # 8 rows: the GEMV
    x129 = inputs(rng, 129, 1, 256)[0]
    check(ops.linear(cp.asarray(x129), wd[:64, :256]), x129, w[:64, :256])   # 129 rows: past the widest variant
    assert len(calls) == 1


def test_pdl_on_every_kernel(calls, monkeypatch):
    from openinfer.kernels.cuda import pdl
    monkeypatch.setattr(pdl, "ENABLED", True)
    monkeypatch.setattr(pdl, "KERNELS", None)
    rng = np.random.default_rng(9)
    x, w1 = inputs(rng, 32, 2560, 2560)
    _, w2 = inputs(rng, 32, 6144, 2560)
    h = ops.linear(cp.asarray(x), cp.asarray(w1))
    got = ops.linear(h, cp.asarray(w2))
    want_h = ref.linear(x.astype(np.float32), w1.astype(np.float32)).astype(BF16).astype(np.float32)
    np.testing.assert_allclose(cp.asnumpy(got).astype(np.float32), want_h @ w2.astype(np.float32).T,
                               rtol=3e-2, atol=3e-2)
    assert len(calls) == 2


def test_graph_capture_replays(calls):
    """A chain of skinny GEMMs captured once and replayed on new inputs equals the eager chain bit for bit."""
    rng = np.random.default_rng(11)
    ws = [cp.asarray(inputs(rng, 1, n, k)[1]) for n, k in ((6144, 2560), (2560, 6144), (19456, 2560))]
    stream = cp.cuda.Stream(non_blocking=True)

    def chain(x):
        h = ops.linear(x, ws[0])
        h = ops.linear(h, ws[1])
        return ops.linear(h, ws[2])

    for m in (16, 128):
        x = cp.asarray(inputs(rng, m, 1, 2560)[0])
        with stream:
            chain(x)
            stream.begin_capture()
            y = chain(x)
            graph = stream.end_capture()
            for _ in range(2):
                x[...] = cp.asarray(inputs(rng, m, 1, 2560)[0])
                graph.launch(stream)
                replayed = cp.asnumpy(y)
                eager = cp.asnumpy(chain(x))
                stream.synchronize()
                np.testing.assert_array_equal(replayed, eager)
    assert blas.skinny_gemm is skinny_gemm and len(calls) >= 12


def test_start_up_tuning(monkeypatch, tmp_path):
    """skinny_tune on the GPU: every (width, weight) pair timed once against cuBLASLt or the GEMV and kept on disk (a
    second start reads it); under "tune" linear then takes the kernel exactly where a factor was chosen, and is
    right."""
    from openinfer.kernels.cuda import lt_tune, skinny_tune
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(skinny_gemm, "MODE", "tune")
    monkeypatch.setattr(skinny_gemm, "split_choice", {})
    shapes, ms = {(2560, 4096), (6144, 2560)}, [8, 16, 32]
    lt_tune.tune(ms, shapes)
    got = skinny_tune.tune(ms, shapes)
    assert (got.cached, got.timed) == (0, 6) and len(skinny_gemm.split_choice) == 6   # widths 8, 16, 32
    first = dict(skinny_gemm.split_choice)
    skinny_gemm.split_choice.clear()
    assert skinny_tune.tune(ms, shapes).cached == 6 and skinny_gemm.split_choice == first
    rng = np.random.default_rng(2)
    for (dev, mp, n, k), (splits, _) in first.items():
        x, w = inputs(rng, mp, n, k)
        seen = []
        real = skinny_gemm.gemm
        monkeypatch.setattr(skinny_gemm, "gemm", lambda *a, **kw: (seen.append(1), real(*a, **kw))[1])
        check(ops.linear(cp.asarray(x), cp.asarray(w)), x, w)
        assert len(seen) == (splits > 0)
