"""Expert parallelism on the kimi_k2 line (CPU, ranks as threads of one process joined by the in-process group):
EP = 2, 4 and 8 give EP = 1's logits and greedy tokens step for step, through batching, chunked prefill and a
prefix-cache hit, with INT4-packed experts sharded per rank and with DeepSeek-V3's grouped routing."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.testing import EngineArgs, build_engine
from openinfer.testing import get_plugins
from openinfer.testing.engine import generate, greedy
from openinfer.testing.parallel import assert_ranks_match, record_steps, replay_on_ranks

# a 24-token budget chunks the 50-token prompt; the last prompt shares its first 40 tokens (a prefix hit)
ARGS = EngineArgs(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=24)


@pytest.fixture(scope="module", params=["kimi_int4", "v3_grouped"])
def ep1(request, vocab):
    ckpt = request.getfixturevalue(request.param)[0]
    long = [int(t) for t in np.random.default_rng(3).integers(0, vocab - 256, size=50)]
    engine = build_engine(str(ckpt), ARGS)
    steps = record_steps(engine)
    generate(engine, [long, long[:7], [5, 9, 11]], greedy(6))
    [(_, _, cached)] = generate(engine, [long[:40] + [17, 18, 19]], greedy(6))
    assert cached > 0
    engine.shutdown()
    return str(ckpt), steps


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_ep_ranks_give_ep1_logits(ep1, world_size):
    ckpt, steps = ep1
    per_rank, recorders = replay_on_ranks(ckpt, ARGS, get_plugins(), steps, world_size)
    assert_ranks_match(steps, per_rank, recorders)
