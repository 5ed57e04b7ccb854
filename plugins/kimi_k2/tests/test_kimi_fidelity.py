"""The kimi_k2 line against transformers 5.24.0 on tiny random models: DeepSeek-V3 with grouped noaux_tc routing
(n_group 4), Kimi's routing (n_group 1), a Kimi INT4 pack-quantized checkpoint and an FP8 block-scaled one (their
references: deepseek_v3 copies holding the dequantized weights). Logits, greedy continuations, batched, chunked,
prefix-cache hits."""
from __future__ import annotations

import numpy as np
import pytest

from openinfer.testing import EngineArgs, build_engine
from openinfer.testing.engine import generate, greedy, prompt_logits
from openinfer.testing.hf_reference import hf_greedy_stepwise as hf_greedy, hf_logits

CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the weather in Paris today? Name three prime numbers."}]


def engine_for(ckpt, **kw):
    return build_engine(str(ckpt), EngineArgs(**kw))


def chat_prompt(engine) -> list[int]:
    return engine.tokenizer.encode(engine.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True))


def random_prompt(n: int, seed: int, vocab: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab - 256, size=n)]


def assert_logits_close(ours: np.ndarray, ref: np.ndarray) -> None:
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("which, steps", [("v3_grouped", 32), ("v3_kimi", 32), ("kimi_int4", 32), ("kimi_fp8", 8)])
def test_logits_and_greedy_match_transformers(which, steps, request):
    ckpt, hf = request.getfixturevalue(which)
    eng = engine_for(ckpt)
    assert eng.runner.model.__class__.__name__ == "MLAMoEDecoder"
    ids = chat_prompt(eng)
    assert eng.tokenizer.decode(ids, skip_special_tokens=False).endswith("<|im_assistant|>assistant<|im_middle|>")
    assert_logits_close(prompt_logits(eng, ids), hf_logits(hf, ids))
    [(tokens, fin, _)] = generate(eng, [ids], greedy(steps))
    assert tokens == hf_greedy(hf, ids, steps)
    assert fin.reason == "length" and fin.completion_tokens == steps


def test_quantized_experts_stay_packed(kimi_int4, kimi_fp8):
    from openinfer.testing import Fp8Weight, Int4Weight
    moe = engine_for(kimi_int4[0]).runner.model.layers[1].mlp
    assert isinstance(moe.w.gate_up, Int4Weight) and moe.w.gate_up.packed.dtype == np.int32
    assert moe.w.gate_up.tiled and moe.w.gate_up.shape == (16, 128, 64) and moe.w.down.shape == (16, 64, 64)
    assert moe.w.gate_up.packed.shape == (16, 8, 2, 16, 4) and moe.w.down.scale.shape == (16, 4, 1, 16, 2)
    layer = engine_for(kimi_fp8[0]).runner.model.layers[1]
    assert isinstance(layer.mlp.w.down, Fp8Weight) and layer.mlp.w.down.data.dtype == np.uint8
    assert isinstance(layer.attn.w.o, Fp8Weight)


def _prompts(eng, n: int, vocab: int) -> list[list[int]]:
    base = chat_prompt(eng)
    return [base[: 5 + 4 * i] + random_prompt(i, i, vocab) for i in range(n)]


def test_batched_requests_of_different_lengths(kimi_int4, vocab):
    ckpt, hf = kimi_int4
    eng = engine_for(ckpt)
    prompts = _prompts(eng, 3, vocab)
    for p, (tokens, _, _) in zip(prompts, generate(eng, prompts, greedy(6))):
        assert tokens == hf_greedy(hf, p, 6)


def test_chunked_prefill_matches(kimi_int4, vocab):
    ckpt, hf = kimi_int4
    ids = chat_prompt(engine_for(ckpt)) + random_prompt(20, 2, vocab)
    want = hf_greedy(hf, ids, 16)
    for budget in (5, 16):
        [(tokens, _, _)] = generate(engine_for(ckpt, max_num_batched_tokens=budget), [ids], greedy(16))
        assert tokens == want, f"token budget {budget}"


def test_prefix_cache_hit_same_output(kimi_int4, vocab):
    ckpt, hf = kimi_int4
    eng = engine_for(ckpt, block_size=16)
    ids = chat_prompt(eng) + random_prompt(20, 3, vocab)
    [(first, _, cached0)] = generate(eng, [ids], greedy(16))
    [(again, _, cached1)] = generate(eng, [ids], greedy(16))
    assert cached0 == 0 and cached1 >= 16
    assert first == again == hf_greedy(hf, ids, 16)


def test_long_positions_with_yarn(v3_kimi, vocab):
    """Positions far past original_max_position_embeddings (64), where Kimi's one-step YaRN ramp acts."""
    ckpt, hf = v3_kimi
    ids = random_prompt(400, 1, vocab)
    assert_logits_close(prompt_logits(engine_for(ckpt), ids)[-32:], hf_logits(hf, ids)[-32:])
