"""Expert parallelism on the DeepSeek-V2 line (CPU): EP = 2, 4 and 8 give EP = 1's logits and greedy tokens,
step for step, through batching, chunked prefill and a prefix-cache hit; with ranks as threads of one
process (the in-process group) and with EP = 2 as worker processes (the engine's executor)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from openinfer.testing import EngineArgs, build_engine
from openinfer.testing import get_plugins
from openinfer.testing.engine import generate, greedy
from openinfer.testing.parallel import assert_logits_match, assert_ranks_match, record_steps, replay_on_ranks

from dsv2_tiny import VOCAB

# a 24-token budget chunks the 50-token prompt; the last prompt shares its first 40 tokens (a prefix hit)
ARGS = EngineArgs(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=24)
LONG = [int(t) for t in np.random.default_rng(3).integers(2, VOCAB, size=50)]
FIRST = [LONG, LONG[:7], [5, 9, 11]]
SECOND = LONG[:40] + [17, 18, 19]


def _run(engine) -> list[list[int]]:
    tokens = [t for t, _, _ in generate(engine, FIRST, greedy(8))]
    [(second, _, cached)] = generate(engine, [SECOND], greedy(8))
    assert cached > 0
    return tokens + [second]


def _ep1(ckpt):
    """The steps an EP = 1 engine ran (with their logits) and its tokens."""
    engine = build_engine(str(ckpt), ARGS)
    steps = record_steps(engine)
    tokens = _run(engine)
    engine.shutdown()
    return str(ckpt), steps, tokens


@pytest.fixture(scope="module", params=["lite", "full"])
def ep1(request):
    return _ep1(request.getfixturevalue(request.param)[0])


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_ep_ranks_give_ep1_logits(ep1, world_size):
    ckpt, steps, _ = ep1
    per_rank, recorders = replay_on_ranks(ckpt, ARGS, get_plugins(), steps, world_size)
    assert_ranks_match(steps, per_rank, recorders)


def test_ep2_worker_process_gives_ep1_tokens(lite):
    ckpt, steps, tokens = _ep1(lite[0])
    engine = build_engine(ckpt, replace(ARGS, ep=2))
    try:
        got = record_steps(engine)
        assert _run(engine) == tokens
        assert_logits_match([w for _, w in steps], [g for _, g in got])
    finally:
        engine.shutdown()
