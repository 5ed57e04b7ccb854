"""The choices of one prompt (n > 1): the first computes the prompt, the others wait for it and take it from the
prefix cache, so the prompt is computed once; their outputs are what they are alone."""
from __future__ import annotations

import pytest

from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.sampling.sampler import SamplingParams
from openinfer.testing.engine import collect, greedy

PROMPT = [(7 * i + 3) % 5000 + 100 for i in range(40)]


@pytest.fixture(scope="module")
def engine():
    return build_engine(None, EngineArgs(max_model_len=256, kv_cache_memory_gib=0.02, max_num_batched_tokens=16))


def run(engine, specs):
    """specs: (request id, prompt, params, after). Each request's (tokens, cached tokens), and the tokens computed."""
    streams = [engine.submit(list(p), params, rid, after=after) for rid, p, params, after in specs]
    computed = 0
    while engine.has_unfinished():
        computed += engine.step().num_tokens
    return [collect(s)[::2] for s in streams], computed


def test_choices_compute_their_prompt_once(engine) -> None:
    """Greedy choices: the followers hit the leader's two full blocks and compute the third; all four match the
    prompt sent alone."""
    other = [p + 1 for p in PROMPT]   # a prompt no other test caches
    choices = [(f"c{i}", other, greedy(5), "c0" if i else None) for i in range(4)]
    got, computed = run(engine, choices)
    assert [cached for _, cached in got] == [0, 32, 32, 32]
    assert computed == 40 + 3 * 8 + 4 * 4   # the prompt once, each follower's last partial block, 4 decode steps
    assert all(tokens == got[0][0] for tokens, _ in got)
    assert got[0][0] == run(engine, [("solo", other, greedy(5), None)])[0][0][0]


def test_sampled_choices_and_a_leader_that_ends_first(engine) -> None:
    """Sampled choices share the prompt too and draw apart; a follower whose leader was aborted before its prompt
    was computed runs anyway, computing the prompt itself. (Seeded draws are not compared with the same seeds run
    alone: a follower's logits come from other batch shapes, whose rounding reorders near-ties of random weights.)"""
    prompt = [p + 2 for p in PROMPT]
    sampled = [SamplingParams(max_tokens=4, seed=s, temperature=1.0, ignore_eos=True) for s in (1, 2)]
    got, _ = run(engine, [("s0", prompt, sampled[0], None), ("s1", prompt, sampled[1], "s0")])
    assert [cached for _, cached in got] == [0, 32] and got[0][0] != got[1][0] and len(got[1][0]) == 4
    fresh = [p + 3 for p in PROMPT]
    lead = engine.submit(list(fresh), greedy(3), "gone")
    follow = engine.submit(list(fresh), greedy(3), "follows", after="gone")
    engine.abort("gone")
    while engine.has_unfinished():
        engine.step()
    tokens, fin, cached = collect(follow)
    assert fin.reason == "length" and len(tokens) == 3 and cached == 0
    assert collect(lead)[1].reason == "abort"


def test_short_prompts_do_not_wait(engine) -> None:
    """A prompt within one block has nothing a follower could take from the cache: the choices run together."""
    short = PROMPT[:12]
    got, computed = run(engine, [("t0", short, greedy(2), None), ("t1", short, greedy(2), "t0")])
    assert [cached for _, cached in got] == [0, 0] and computed == 2 * 12 + 2
