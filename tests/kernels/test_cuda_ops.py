"""The remaining CUDA ops against the numpy reference (GPU only; skipped elsewhere): argmax and top-k
logprobs, graph capture of cuBLAS with kernels, the backend's transfers and memory figures, the Philox normal fill.
The others are by kind: test_cuda_elementwise.py, test_cuda_gemv.py, test_cuda_attention.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.sampling.philox import normals
from cuda_cases import (  # noqa: F401  (the fixtures are used by name)
    BF16, after_inputs, arrival_counters_left_zero, cp, dev, dt, exact, host, own_stream, rnd)
from openinfer.kernels.cuda import ops
from openinfer.kernels.cuda.random_fill import fill_normal

pytestmark = pytest.mark.cuda


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


@pytest.mark.parametrize("k", [0, 3])
def test_score_rows_matches_numpy(dt, k):
    """Prompt logprobs: each row's target scored as sampling.score_rows scores it (logprob, rank, top k)."""
    from openinfer.sampling.sampler import score_rows
    rng = np.random.default_rng(6)
    R, V = 6, 10007
    logits = exact(rnd(rng, R, V, scale=4), dt[0])
    targets = rng.integers(0, V, R).astype(np.int32)
    targets[0] = logits[0].argmax()                       # rank 1
    logits[1, [3, 700, 9000]] = logits[1, targets[1]]     # ties with the target do not lower its rank
    want = score_rows(logits, targets, k)
    got = [cp.asnumpy(a) for a in ops.score_rows(dev(logits, dt[0]), cp.asarray(targets), k)]
    np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[3], want[3])
    np.testing.assert_allclose(got[2], want[2], atol=1e-4, rtol=1e-5)


def test_graph_capture_replays_cublas_and_kernels():
    rng = np.random.default_rng(5)
    x, w, nw = (dev(rnd(rng, *s), BF16) for s in ((12, 256), (512, 256), (512,)))  # 12 rows: cuBLAS, not GEMV
    stream = cp.cuda.Stream(non_blocking=True)
    with after_inputs(stream):
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
