"""The Qwen3 line against transformers on tiny random models: logits and greedy continuations,
also batched, chunked, and on prefix-cache hits."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.engine import EngineArgs, build_engine
from openinfer.testing.engine import (assert_prefix_hit, assert_scores_match, generate, greedy, prompt_logits,
                                      score_prompt)
from openinfer.testing.hf_reference import hf_greedy, hf_logits

CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three prime numbers and explain why 1 is not prime."}]


def engine_for(ckpt, **kw):
    return build_engine(str(ckpt), EngineArgs(**kw))


def chat_prompt(engine) -> list[int]:
    text = engine.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, enable_thinking=False)
    return engine.tokenizer.encode(text)


def assert_logits_close(ours: np.ndarray, ref: np.ndarray) -> None:
    scale = np.abs(ref).max()
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("which", ["tied", "untied", "yarn", "bf16"])
def test_logits_and_greedy_match_transformers(which, request):
    ckpt, hf = request.getfixturevalue(which)
    eng = engine_for(ckpt)
    ids = chat_prompt(eng)
    assert_logits_close(prompt_logits(eng, ids), hf_logits(hf, ids))
    [(tokens, fin, _)] = generate(eng, [ids], greedy(32))
    assert tokens == hf_greedy(hf, ids, 32)
    assert fin.reason == "length" and fin.completion_tokens == 32


def test_long_positions_with_yarn(yarn):
    ckpt, hf = yarn
    eng = engine_for(ckpt)
    ids = list(np.random.default_rng(1).integers(0, 151000, size=1500))
    ids = [int(i) for i in ids]
    assert_logits_close(prompt_logits(eng, ids)[-64:], hf_logits(hf, ids)[-64:])


def _prompts(eng, n=8):
    base = chat_prompt(eng)
    rng = np.random.default_rng(0)
    return [base[: 5 + 9 * i] + [int(t) for t in rng.integers(0, 151000, size=i)] for i in range(n)]


def test_concurrent_requests_of_different_lengths(untied):
    ckpt, hf = untied
    eng = engine_for(ckpt)
    prompts = _prompts(eng)
    results = generate(eng, prompts, greedy(32))
    for p, (tokens, _, _) in zip(prompts, results):
        assert tokens == hf_greedy(hf, p, 32)


def test_chunked_prefill_matches(untied):
    ckpt, hf = untied
    ids = chat_prompt(engine_for(ckpt))
    want = hf_greedy(hf, ids, 32)
    for budget in (7, 16, 33):
        eng = engine_for(ckpt, max_num_batched_tokens=budget)
        [(tokens, _, _)] = generate(eng, [ids], greedy(32))
        assert tokens == want, f"token budget {budget}"
    # several requests sharing small budgets: decode rows and prefill chunks in one step
    eng = engine_for(ckpt, max_num_batched_tokens=12)
    prompts = _prompts(eng, 4)
    for p, (tokens, _, _) in zip(prompts, generate(eng, prompts, greedy(16))):
        assert tokens == hf_greedy(hf, p, 16)


def test_prefix_cache_hit_reports_cached_tokens_and_same_output(untied):
    ckpt, hf = untied
    eng = engine_for(ckpt, block_size=16)
    ids = chat_prompt(eng)
    first = assert_prefix_hit(eng, ids, 32)
    assert first == hf_greedy(hf, ids, 32)
    # turn 2 of a conversation reuses turn 1 (prompt + its output) from the cache
    turn2 = ids + first + eng.tokenizer.encode("<|im_end|>\n<|im_start|>user\nAnd five more?<|im_end|>\n")
    [(tokens, _, cached2)] = generate(eng, [turn2], greedy(16))
    assert cached2 >= (len(ids) + len(first)) // 16 * 16 - 16
    assert tokens == hf_greedy(hf, turn2, 16)
    disabled = engine_for(ckpt, enable_prefix_caching=False)
    [(plain, _, c)] = generate(disabled, [turn2], greedy(16))
    assert c == 0 and plain == tokens


@pytest.mark.parametrize("which", ["untied", "bf16"])
def test_prompt_logprobs_match_transformers(which, request):
    """Prompt logprobs (echo / prompt_logprobs), scored 4 rows a step, against transformers' log-softmax."""
    ckpt, hf = request.getfixturevalue(which)
    eng = engine_for(ckpt, max_num_seqs=4, max_num_batched_tokens=16)
    ids = chat_prompt(eng)
    scored, _, _ = score_prompt(eng, ids, 3)
    assert_scores_match(scored, ids, hf_logits(hf, ids), 3)
