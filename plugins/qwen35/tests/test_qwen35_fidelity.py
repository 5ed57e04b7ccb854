"""The Qwen3.5 line against transformers on tiny random models: logits and greedy continuations,
also batched, chunked (chunk ends inside and across conv windows) and on prefix-cache hits,
where the recurrent state must come back from a checkpoint together with the attention KV."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.testing import EngineArgs, build_engine
from openinfer.testing.engine import (assert_scores_match, collect, generate, greedy, prompt_logits, run_to_completion,
                                     score_prompt)
from openinfer.testing.hf_reference import hf_greedy_stepwise, hf_logits


def engine_for(ckpt, **kw):
    return build_engine(str(ckpt), EngineArgs(**kw))


def tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, size=n)]


def assert_logits_close(ours: np.ndarray, ref: np.ndarray) -> None:
    scale = np.abs(ref).max()
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("which", ["untied", "tied", "text_only"])
def test_logits_and_greedy_match_transformers(which, request):
    ckpt, hf = request.getfixturevalue(which)
    eng = engine_for(ckpt)
    ids = tokens(45, seed=1)
    assert_logits_close(prompt_logits(eng, ids), hf_logits(hf, ids))
    [(out, fin, _)] = generate(eng, [ids], greedy(32))
    assert out == hf_greedy_stepwise(hf, ids, 32)
    assert fin.reason == "length" and fin.completion_tokens == 32


def test_prompt_logprobs_match_transformers(untied):
    """Prompt logprobs scored 3 rows a step (so 3-token chunks, ending inside and across conv windows) against
    transformers' log-softmax; the generation is the unscored one's."""
    ckpt, hf = untied
    eng = engine_for(ckpt, max_num_seqs=3, max_num_batched_tokens=8)
    ids = tokens(40, seed=9)
    scored, out, cached = score_prompt(eng, ids, 2)
    assert_scores_match(scored, ids, hf_logits(hf, ids), 2)
    assert out == score_prompt(eng, ids, None)[1] and cached == 0


def test_choices_of_one_prompt_share_its_state(untied):
    """n > 1: the followers wait for the first choice's prefill and hit its state checkpoint with the KV."""
    ckpt, hf = untied
    eng = engine_for(ckpt)
    ids = tokens(45, seed=11)
    streams = [eng.submit(ids, greedy(8), f"c{i}", after="c0" if i else None) for i in range(3)]
    run_to_completion(eng, streams)
    got = [collect(s) for s in streams]
    assert [cached for _, _, cached in got] == [0, 32, 32]
    want = hf_greedy_stepwise(hf, ids, 8)
    assert all(out == want for out, _, _ in got)


def test_short_prompts_and_single_token_prompt(untied):
    """Prompts shorter than the conv window, and a one-token prompt (its first step is a
    one-token run with no state before it, so it takes the decode ops)."""
    ckpt, hf = untied
    eng = engine_for(ckpt)
    prompts = [tokens(1, seed=2), tokens(2, seed=3), tokens(3, seed=4)]
    for p, (out, _, _) in zip(prompts, generate(eng, prompts, greedy(12))):
        assert out == hf_greedy_stepwise(hf, p, 12)


def test_concurrent_requests_of_different_lengths(untied):
    ckpt, hf = untied
    prompts = [tokens(3 + 11 * i, seed=10 + i) for i in range(6)]
    want = [hf_greedy_stepwise(hf, p, 24) for p in prompts]
    assert [out for out, _, _ in generate(engine_for(ckpt), prompts, greedy(24))] == want
    # two state slots for six requests: later ones reuse rows that hold a finished request's state
    assert [out for out, _, _ in generate(engine_for(ckpt, max_num_seqs=2), prompts, greedy(24))] == want


def test_abort_frees_the_state_slot(untied):
    ckpt, hf = untied
    eng = engine_for(ckpt, max_num_seqs=1)
    first = eng.submit(tokens(20, seed=30), greedy(50))
    second = eng.submit(tokens(9, seed=31), greedy(8))
    for _ in range(3):
        eng.step()
    eng.abort(first.request_id)
    run_to_completion(eng, [first, second])
    assert collect(first)[1].reason == "abort"
    assert collect(second)[0] == hf_greedy_stepwise(hf, tokens(9, seed=31), 8)


def test_chunked_prefill_matches(untied):
    """Budgets 2 and 3 end chunks inside a conv window (K = 4), 5 and 7 across them; with
    several requests, decode rows and prefill chunks share steps."""
    ckpt, hf = untied
    ids = tokens(50, seed=5)
    want = hf_greedy_stepwise(hf, ids, 16)
    for budget in (2, 3, 5, 7, 33):
        eng = engine_for(ckpt, max_num_batched_tokens=budget, enable_prefix_caching=False)
        [(out, _, _)] = generate(eng, [ids], greedy(16))
        assert out == want, f"token budget {budget}"
    eng = engine_for(ckpt, max_num_batched_tokens=9)
    prompts = [tokens(6 + 13 * i, seed=20 + i) for i in range(4)]
    for p, (out, _, _) in zip(prompts, generate(eng, prompts, greedy(12))):
        assert out == hf_greedy_stepwise(hf, p, 12)


def test_prefix_cache_hit_restores_the_recurrent_state(untied):
    ckpt, hf = untied
    eng = engine_for(ckpt, block_size=16)
    ids = tokens(45, seed=6)
    [(first, _, cached0)] = generate(eng, [ids], greedy(24))
    [(again, fin, cached1)] = generate(eng, [ids], greedy(24))
    assert cached0 == 0 and cached1 == 32 and fin.cached_tokens == 32
    assert first == again == hf_greedy_stepwise(hf, ids, 24)
    # turn 2 of a conversation: turn 1's prompt + answer + a new message; the hit ends at the
    # last block boundary turn 1 crossed while decoding (its rolling checkpoint)
    turn2 = ids + first + tokens(10, seed=7)
    [(out, _, cached2)] = generate(eng, [turn2], greedy(16))
    assert cached2 == (len(ids) + len(first) - 1) // 16 * 16 == 64
    assert out == hf_greedy_stepwise(hf, turn2, 16)
    [(plain, _, c)] = generate(engine_for(ckpt, enable_prefix_caching=False), [turn2], greedy(16))
    assert c == 0 and plain == out


def test_prefix_hit_needs_a_state_checkpoint(untied):
    """Blocks whose KV is cached but whose boundary has no state checkpoint are recomputed:
    the hit stops at the last boundary with a checkpoint."""
    ckpt, hf = untied
    eng = engine_for(ckpt, block_size=8, max_num_batched_tokens=1024)
    long = tokens(60, seed=8)                # checkpoint at 56 (its last full block) only
    generate(eng, [long], greedy(1))
    shared = long[:40] + tokens(20, seed=9)  # KV of blocks 0..4 is cached; no checkpoint at 40
    [(out, _, cached)] = generate(eng, [shared], greedy(8))
    assert cached == 0
    assert out == hf_greedy_stepwise(hf, shared, 8)
    no_ckpt = engine_for(ckpt, block_size=8, num_state_checkpoints=0)
    generate(no_ckpt, [long], greedy(1))
    [(out2, _, cached2)] = generate(no_ckpt, [long], greedy(8))
    assert cached2 == 0 and out2 == hf_greedy_stepwise(hf, long, 8)


def test_prefix_hits_under_slot_and_checkpoint_pressure(untied):
    """Few slots and checkpoints, small blocks and budget: checkpoints are evicted and rows
    reused while saves and restores are queued; outputs equal the uncached engine's."""
    ckpt, _ = untied
    base = tokens(40, seed=40)
    waves = [[base[:m] + tokens(5 + m % 7, seed=m) for m in (8, 17, 24, 33, 40)],
             [base[:m] + tokens(3, seed=100 + m) for m in (16, 40, 9, 33, 25, 24)]]
    kw = dict(block_size=8, max_num_batched_tokens=16, max_num_seqs=3)
    cached = engine_for(ckpt, num_state_checkpoints=2, **kw)
    plain = engine_for(ckpt, enable_prefix_caching=False, **kw)
    hits = 0
    for wave in waves:
        got = generate(cached, wave, greedy(10))
        assert [out for out, _, _ in got] == [out for out, _, _ in generate(plain, wave, greedy(10))]
        hits += sum(c for _, _, c in got)
    assert hits > 0


def test_fp8_kv_cache_keeps_greedy_across_chunks_batches_and_prefix_hits(untied):
    """--kv-cache-dtype fp8 rounds the full-attention layers' keys and values to e4m3 (the Gated DeltaNet state
    stays float32): each prompt's greedy tokens are the same alone, batched, in chunks that cross a conv window,
    and on a prefix hit that restores the recurrent state; logits stay near the float32 cache's."""
    ckpt, _ = untied
    eng = engine_for(ckpt, kv_cache_dtype="fp8", block_size=16)
    assert eng.runner.pools.paged["kv"]["k"].dtype == np.uint8
    prompts = [tokens(6 + 13 * i, seed=40 + i) for i in range(4)]
    alone = [generate(eng, [p], greedy(12))[0][0] for p in prompts]
    assert [t for t, _, _ in generate(eng, prompts, greedy(12))] == alone
    chunked = engine_for(ckpt, kv_cache_dtype="fp8", max_num_batched_tokens=7, enable_prefix_caching=False)
    assert [t for t, _, _ in generate(chunked, prompts, greedy(12))] == alone
    ids = tokens(45, seed=6)
    [(first, _, _)] = generate(eng, [ids], greedy(8))
    [(again, _, cached)] = generate(eng, [ids], greedy(8))
    assert cached == 32 and again == first
    got, want = prompt_logits(eng, ids), prompt_logits(engine_for(ckpt), ids)
    assert 0 < np.abs(got - want).max() < 0.1 * np.abs(want).max()
