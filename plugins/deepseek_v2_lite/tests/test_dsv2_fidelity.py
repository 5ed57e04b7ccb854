"""The DeepSeek-V2 line against transformers on tiny random models (V2-Lite's shape, and the full V2's
q-LoRA + group-limited routing): logits and greedy continuations, also batched, chunked, on prefix-cache
hits and after a restore from the host offload tier."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.engine import EngineArgs, build_engine
from openinfer.kv.pool import bytes_per_block
from openinfer.testing.engine import assert_prefix_hit, generate, greedy, prompt_logits
from openinfer.testing.hf_reference import hf_greedy_stepwise, hf_logits

from dsv2_tiny import VOCAB

_REFERENCE: dict[tuple[int, tuple[int, ...]], list[int]] = {}


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    """transformers' greedy continuation, computed once per model and prompt (its CPU decode is what makes
    these tests slow). Through the model's own forward and cache, which equals full recomputation: generate's
    min_new_tokens would suppress EOS, which a tiny random model with a 400-token vocabulary does emit."""
    key = (id(hf), tuple(ids))
    if len(_REFERENCE.get(key, ())) < n:
        _REFERENCE[key] = hf_greedy_stepwise(hf, ids, n)
    return _REFERENCE[key][:n]

CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three prime numbers and explain why 1 is not prime."}]


def engine_for(ckpt, **kw):
    return build_engine(str(ckpt), EngineArgs(**kw))


def chat_prompt(engine) -> list[int]:
    return engine.tokenizer.encode(engine.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True))


def random_prompt(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(2, VOCAB, size=n)]


def assert_logits_close(ours: np.ndarray, ref: np.ndarray) -> None:
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("which", ["lite", "full", "full_bf16"])
def test_logits_and_greedy_match_transformers(which, request):
    ckpt, hf = request.getfixturevalue(which)
    eng = engine_for(ckpt)
    ids = chat_prompt(eng)
    assert ids[0] == 0 and eng.tokenizer.decode(ids[1:]).endswith("\n\nAssistant:")
    assert_logits_close(prompt_logits(eng, ids), hf_logits(hf, ids))
    [(tokens, fin, _)] = generate(eng, [ids], greedy(32))
    assert tokens == hf_greedy(hf, ids, 32)
    assert fin.reason == "length" and fin.completion_tokens == 32


def test_long_positions_with_yarn(full):
    """Positions far past original_max_position_embeddings (64), where YaRN's interpolation acts."""
    ckpt, hf = full
    ids = random_prompt(700, 1)
    assert_logits_close(prompt_logits(engine_for(ckpt), ids)[-48:], hf_logits(hf, ids)[-48:])


def _prompts(eng, n: int) -> list[list[int]]:
    base = chat_prompt(eng)
    return [base[: 5 + 4 * i] + random_prompt(i, i) for i in range(n)]


def test_concurrent_requests_of_different_lengths(full):
    """Batched requests give each one's solo tokens; the longest one's are transformers'."""
    ckpt, hf = full
    eng = engine_for(ckpt)
    prompts = _prompts(eng, 6)
    solo = [generate(eng, [p], greedy(16))[0][0] for p in prompts]
    assert [tokens for tokens, _, _ in generate(eng, prompts, greedy(16))] == solo
    assert solo[-1] == hf_greedy(hf, prompts[-1], 16)


def test_chunked_prefill_matches(lite):
    ckpt, hf = lite
    ids = chat_prompt(engine_for(ckpt))
    want = hf_greedy(hf, ids, 32)[:24]
    for budget in (5, 16):
        [(tokens, _, _)] = generate(engine_for(ckpt, max_num_batched_tokens=budget), [ids], greedy(24))
        assert tokens == want, f"token budget {budget}"
    # decode rows and prefill chunks of several requests in one step give the unchunked engine's tokens
    prompts = _prompts(engine_for(ckpt), 4)
    whole = [t for t, _, _ in generate(engine_for(ckpt), prompts, greedy(12))]
    assert [t for t, _, _ in generate(engine_for(ckpt, max_num_batched_tokens=12), prompts, greedy(12))] == whole


def test_prefix_cache_hit_reports_cached_tokens_and_same_output(full):
    ckpt, hf = full
    eng = engine_for(ckpt, block_size=16)
    ids = chat_prompt(eng)
    first = assert_prefix_hit(eng, ids, 32)
    assert first == hf_greedy(hf, ids, 32)
    # turn 2 of a conversation reuses turn 1 (prompt + its output), and gives the uncached engine's tokens
    turn2 = ids + first + eng.tokenizer.encode("<｜end▁of▁sentence｜>User: And five more?\n\nAssistant:")
    [(tokens, _, cached2)] = generate(eng, [turn2], greedy(12))
    assert cached2 >= (len(ids) + len(first)) // 16 * 16 - 16
    [(plain, _, c)] = generate(engine_for(ckpt, enable_prefix_caching=False), [turn2], greedy(12))
    assert c == 0 and tokens == plain


def test_host_tier_restore_gives_identical_tokens(lite):
    """--kv-offload: the latent blocks evicted from a small device pool come back from the host tier
    (cached tokens reported) and the output is the cold run's."""
    ckpt, _ = lite
    eng = engine_for(ckpt)
    groups = eng.runner.pools.groups.values()
    per_block = bytes_per_block(list(groups), 16, {g.name: 4 for g in groups})
    eng = engine_for(ckpt, max_model_len=512, kv_cache_memory_gib=24 * per_block / 2**30, kv_offload=True,
                     kv_offload_host_gib=64 * per_block / 2**30)
    assert eng.blocks.usable_blocks == 23
    prompt = random_prompt(83, 5)
    [(cold, _, cached)] = generate(eng, [prompt], greedy(12))
    assert cached == 0
    for seed in range(3):   # fresh prompts through the whole device pool: nothing of the first stays there
        generate(eng, [random_prompt(eng.blocks.usable_blocks * 8 - 8, 100 + seed)], greedy(4))
    [(restored, fin, cached)] = generate(eng, [prompt], greedy(12))
    assert cached == fin.cached_tokens == 80 and restored == cold
    assert eng.stats().offload.restored_blocks == 5
