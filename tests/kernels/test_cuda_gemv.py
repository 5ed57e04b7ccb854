"""The decode GEMMs against the numpy reference on random inputs (GPU only; skipped elsewhere): linear
(cuBLAS), the GEMV of 1..8 rows with its variants, tuned splits, PDL and graph capture, and its SiLU epilogue.
"""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.kernels import numpy_ops as ref
from cuda_cases import (  # noqa: F401  (the fixtures are used by name)
    BF16, DTYPES, after_inputs, arrival_counters_left_zero, close, cp, dev, dt, exact, host, own_stream, pdl, rnd)
from openinfer.kernels.cuda import ops

pytestmark = pytest.mark.cuda


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


def test_gemv_kernel_with_and_without_pdl(pdl, gemv_calls):
    """The GEMV eager with and without PDL, split-K and tails."""
    from openinfer.kernels.cuda import pdl as pdl_mod
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
        with after_inputs(stream):
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


def test_fused_gemv_kernel_with_and_without_pdl(pdl, gemv_kernels):
    """The SiLU epilogue eager with and without PDL, split-K and not."""
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
        with after_inputs(stream):
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
