"""blas.linear through cuBLASLt with timed algorithms (kernels/cuda/lt.py, lt_tune.py) on the GPU (skipped
elsewhere): against the numpy reference, eager against a CUDA-graph replay bit for bit, and a second start
reading the cache file choosing the same algorithms without timing."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.kernels import numpy_ops as ref
from openinfer.testing.cuda import kernel_stream, require_gpu

pytestmark = pytest.mark.cuda
cp = require_gpu()
ml_dtypes = pytest.importorskip("ml_dtypes")

from cuda_cases import after_inputs  # noqa: E402
from openinfer.kernels.cuda import lt, lt_tune, ops  # noqa: E402  (imports cupy-dependent modules)

BF16 = np.dtype(ml_dtypes.bfloat16)
own_stream = pytest.fixture(autouse=True)(kernel_stream)
MS = [16, 40, 128]
SHAPES = [(6144, 2560), (2560, 9728), (200, 96)]   # (N, K): Qwen3-4B's qkv and down, and a small odd one


@pytest.fixture
def tuned(monkeypatch, tmp_path):
    """Tuned from an empty cache in tmp_path; lt_run records whether each linear took cuBLASLt."""
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(lt, "plans", {})
    took = []
    real = lt.run
    monkeypatch.setattr(lt, "run", lambda *a: took.append(real(*a)) or took[-1])
    return lt_tune.tune(MS, SHAPES), took


def _operands(rng, m, n, k):
    x = rng.standard_normal((m, k)).astype(BF16)
    w = (rng.standard_normal((n, k)) * k ** -0.5).astype(BF16)
    return x, w, cp.asarray(x), cp.asarray(w)


def test_tuned_linear_matches_numpy(tuned):
    result, took = tuned
    assert result == lt_tune.Tuned(cached=0, timed=len(MS) * len(SHAPES), lt=len(MS) * len(SHAPES))
    rng = np.random.default_rng(0)
    for n, k in SHAPES:
        for m in MS:
            x, w, xd, wd = _operands(rng, m, n, k)
            got = cp.asnumpy(ops.linear(xd, wd)).astype(np.float32)
            want = ref.linear(x.astype(np.float32), w.astype(np.float32))
            np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2, err_msg=f"M={m} N={n} K={k}")
    assert took == [True] * len(MS) * len(SHAPES)
    x, w, xd, wd = _operands(rng, 24, *SHAPES[0])   # M not tuned: GemmEx
    ops.linear(xd, wd)
    assert took[-1] is False


def test_graph_replay_is_eager_bit_for_bit(tuned):
    """A chain of tuned GEMMs captured from a pool of its own (as cuda_graphs.py does), replayed on new inputs."""
    rng = np.random.default_rng(1)
    (n0, k0), (n1, k1) = SHAPES[1], (SHAPES[0][0], SHAPES[1][0])   # x[M, 9728] -> [M, 2560] -> [M, 6144]
    assert k1 == SHAPES[0][1]
    w0 = cp.asarray((rng.standard_normal((n0, k0)) * k0 ** -0.5).astype(BF16))
    w1 = cp.asarray((rng.standard_normal((n1, k1)) * k1 ** -0.5).astype(BF16))
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()

    def chain(x):
        return ops.linear(ops.linear(x, w0), w1)

    for m in MS:
        x = cp.asarray(rng.standard_normal((m, k0)).astype(BF16))
        with after_inputs(stream):
            chain(x)
            with cp.cuda.using_allocator(pool.malloc):
                stream.begin_capture()
                y = chain(x)
                graph = stream.end_capture()
            for _ in range(2):
                x[...] = cp.asarray(rng.standard_normal((m, k0)).astype(BF16))
                graph.launch(stream)
                replayed = cp.asnumpy(y)
                np.testing.assert_array_equal(replayed.view(np.uint16), cp.asnumpy(chain(x)).view(np.uint16))
    assert all(tuned[1])


def test_second_start_reads_the_same_algorithms(tuned, monkeypatch):
    first = {key: bytes(plan.algo) for key, plan in lt.plans.items()}
    rng = np.random.default_rng(2)
    x, w, xd, wd = _operands(rng, 40, *SHAPES[0])
    before = cp.asnumpy(ops.linear(xd, wd))
    monkeypatch.setattr(lt, "plans", {})
    monkeypatch.setattr(lt_tune, "fastest", lambda *a: pytest.fail("a warm start timed"))
    assert lt_tune.tune(MS, SHAPES) == lt_tune.Tuned(cached=len(first), timed=0, lt=len(first))
    assert {key: bytes(plan.algo) for key, plan in lt.plans.items()} == first
    np.testing.assert_array_equal(cp.asnumpy(ops.linear(xd, wd)).view(np.uint16), before.view(np.uint16))
