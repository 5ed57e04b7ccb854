"""Why the GPU tests compare logits over shared routing (testing.engine.logits_with_shared_choices), on the CPU: a
float32 engine rounding every op's output to bf16 as the GPU engine stores them (testing.engine.bf16_activations)
moves a few of the tiny INT4 model's expert choices, and each moved choice moves the logits by far more than the
rounding; over the rounded engine's routing the rest of the model stays within bf16 tolerance."""
from __future__ import annotations

import numpy as np

from openinfer.testing.engine import bf16_activations, logits_with_shared_choices, prompt_logits

from kimi_tiny import KIMI, build_checkpoint
from test_kimi_fidelity import chat_prompt, engine_for, random_prompt

LATENT = dict(KIMI, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32)   # the GPU tests'


def test_rounding_moves_the_logits_little_over_shared_routing(tmp_path_factory, kimi_tokenizer_dir, vocab):
    ckpt, _ = build_checkpoint(tmp_path_factory, kimi_tokenizer_dir, vocab, "kimi-int4-shared", LATENT, "int4")
    ref, rounded = engine_for(ckpt), engine_for(ckpt)
    ids = chat_prompt(ref) + random_prompt(300, 7, vocab)
    before = prompt_logits(rounded, ids)
    with bf16_activations(rounded):
        ours, theirs, agree = logits_with_shared_choices(rounded, ref, ids, ["moe_router"])
    assert 0.95 <= agree["moe_router"] < 1.0   # rounding moved some choices, and few
    assert np.abs(ours - theirs).max() < 0.03 * np.abs(theirs).max()
    assert np.array_equal(prompt_logits(rounded, ids), before)   # both helpers put the ops back
    assert np.array_equal(prompt_logits(ref, ids), before)
