"""`beside` (kernels/cuda/beside.py) on the GPU: ops on a side stream, joined where their result is read, eagerly and
in a captured graph; the side ops run in the side lane; MoE's combine joins an addend computed beside (skipped
without a GPU)."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_cases import BF16, captured, cp, dev, host, own_stream, replayed, rnd  # noqa: F401  (fixtures by name)
from openinfer.kernels import numpy_mla_moe as ref
from openinfer.kernels.cuda import lanes, moe, ops
from openinfer.kernels.cuda.beside import Beside, beside, ready

pytestmark = pytest.mark.cuda


def _slow(x: "cp.ndarray", rounds: int = 100) -> "cp.ndarray":
    """Enough dependent kernels (elementwise: a graph captures them) that a reader not joined behind them would see
    the result unwritten."""
    y = x
    for _ in range(rounds):
        y = cp.sin(y) * 0.5 + x
    return y


def _want(x: np.ndarray, rounds: int = 100) -> np.ndarray:
    y = x
    for _ in range(rounds):
        y = np.sin(y) * 0.5 + x
    return y


def test_the_result_is_joined_where_it_is_read():
    x = cp.asarray(rnd(np.random.default_rng(0), 2048, 1024))
    lane_seen = []

    def side(a):
        lane_seen.append(lanes.current())
        return _slow(a)
    b = beside(side, x)
    assert isinstance(b, Beside) and b.shape == (2048, 1024) and b.dtype == x.dtype
    got = ready(b) + 1   # queued on the main stream behind the side's kernels
    np.testing.assert_allclose(cp.asnumpy(got), _want(cp.asnumpy(x)) + 1, rtol=1e-4, atol=1e-4)
    assert lane_seen == [lanes.side_of(lanes.current())]
    assert ready(x) is x   # anything else passes through


def test_a_slice_joins_on_its_own():
    x = cp.asarray(rnd(np.random.default_rng(1), 2048, 1024))
    b = beside(_slow, x)
    got = ready(b[64:1024]) * 2
    np.testing.assert_allclose(cp.asnumpy(got), _want(cp.asnumpy(x))[64:1024] * 2, rtol=1e-4, atol=1e-4)


def test_a_captured_graph_replays_both_branches_and_the_join():
    x = cp.asarray(rnd(np.random.default_rng(2), 2048, 1024))
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    cp.cuda.get_current_stream().synchronize()

    def step():
        b = beside(_slow, x)
        main = x * 3   # beside the side branch
        return ready(b) - main
    with stream:
        out, graph = captured(step, stream, pool)
        for _ in range(2):
            np.testing.assert_allclose(replayed(graph, stream, out), _want(cp.asnumpy(x)) - 3 * cp.asnumpy(x),
                                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("T", [1, 5, 40])
def test_moe_experts_add_an_addend_computed_beside(T):
    """The shared experts' output as the addend, computed beside the routed experts (after a slow start): the
    combine joins it."""
    rng = np.random.default_rng(T)
    E, k, D, I = 8, 2, 256, 128
    x = rnd(rng, T, D).astype(BF16).astype(np.float32)
    gate_up = (rnd(rng, E, 2 * I, D) * 0.05).astype(BF16).astype(np.float32)
    down = (rnd(rng, E, D, I) * 0.05).astype(BF16).astype(np.float32)
    shared_w = (rnd(rng, D, D) * 0.05).astype(BF16).astype(np.float32)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int32)
    weights = rng.random((T, k)).astype(np.float32)
    busy, wd = cp.asarray(rnd(rng, 2048, 1024)), dev(shared_w, BF16)

    def shared_experts(a):
        _slow(busy)
        return ops.linear(a, wd)
    shared = beside(shared_experts, dev(x, BF16))
    got = moe.moe_experts(dev(x, BF16), dev(gate_up, BF16), dev(down, BF16), cp.asarray(ids), cp.asarray(weights), 0,
                          shared)
    addend = (x @ shared_w.T).astype(BF16).astype(np.float32)
    want = ref.moe_experts(x, gate_up, down, ids, weights, 0, addend)
    np.testing.assert_allclose(host(got), want, rtol=3e-2, atol=3e-2 * np.abs(want).max())
