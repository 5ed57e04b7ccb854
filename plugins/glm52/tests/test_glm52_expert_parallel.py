"""Expert parallelism on the GLM-5.x line (CPU), on the tiny sparse model: EP = 2 and EP = 4 give EP = 1's logits
and greedy tokens step for step, through batching, chunked prefill and a prefix-cache hit; with the ranks as threads
of one process (the in-process group) and with EP = 2 as a worker process (the engine's executor)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from openinfer.testing import EngineArgs, build_engine
from openinfer.testing import get_plugins
from openinfer.testing.engine import generate, greedy
from openinfer.testing.parallel import assert_logits_match, assert_ranks_match, record_steps, replay_on_ranks

from test_glm52_fidelity import _prompts, ref_greedy

EP_ARGS = EngineArgs(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=24)


def _ep_run(engine, prompts) -> list[list[int]]:
    """Batched prompts whose chunks (a 24-token budget) and decode steps mix, then a prefix-cache hit."""
    tokens = [t for t, _, _ in generate(engine, prompts, greedy(8))]
    [(again, _, cached)] = generate(engine, [prompts[-1]], greedy(8))
    assert cached > 0
    return tokens + [again]


def run_one_rank(ckpt) -> tuple[list, list[list[int]], list[list[int]]]:
    """The steps an EP = 1 engine ran on `ckpt` (with their logits), its tokens and its prompts."""
    engine = build_engine(str(ckpt), EP_ARGS)
    prompts = _prompts(engine, 3)
    steps = record_steps(engine)
    tokens = _ep_run(engine, prompts)
    engine.shutdown()
    return steps, tokens, prompts


@pytest.fixture(scope="module")
def ep1(sparse):
    ckpt, hf = sparse
    steps, tokens, prompts = run_one_rank(ckpt)
    assert tokens[0] == ref_greedy(hf, prompts[0], 8)
    return str(ckpt), steps, tokens, prompts


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_expert_parallel_in_process_equals_one_rank(ep1, world_size):
    """EP = 2 / 4 / 8 ranks as threads of this process: every rank's logits equal, close to EP = 1's step by step, and
    each rank summed a share of the experts of its own."""
    ckpt, steps, _, _ = ep1
    per_rank, recorders = replay_on_ranks(ckpt, EP_ARGS, get_plugins(), steps, world_size)
    assert_ranks_match(steps, per_rank, recorders)


def test_expert_parallel_engine_greedy(ep1):
    """--ep 2: a worker process holds half the experts; tokens and logits are the single rank's."""
    ckpt, steps, tokens, prompts = ep1
    engine = build_engine(ckpt, replace(EP_ARGS, ep=2))
    try:
        got = record_steps(engine)
        assert _ep_run(engine, prompts) == tokens
        assert_logits_match([w for _, w in steps], [g for _, g in got])
    finally:
        engine.shutdown()
