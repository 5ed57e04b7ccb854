"""Tiny random Qwen3.5 checkpoints built with transformers, shared by the tests:
the real layout (Qwen3_5ForConditionalGeneration, weights under model.language_model.) untied
and tied, and a text-only export (Qwen3_5ForCausalLM, weights under model.)."""
from __future__ import annotations

import pytest

from openinfer.testing.tokenizers import genuine_qwen3_tokenizer_dir

# 8 layers: two full-attention layers (3, 7), so both state groups have several layers;
# nk=2 / nv=4 exercises value head j -> key head j // 2
TEXT = dict(hidden_size=64, num_hidden_layers=8, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, vocab_size=256,
            max_position_embeddings=4096, rms_norm_eps=1e-6,
            layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_section": [2, 1, 1], "mrope_interleaved": True})
VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)


def long_memory(model) -> None:
    """Slow decays (exp(g) ~ 0.9 per token) so the recurrent state carries far: with A_log
    perturbed around 1 it would forget within a few tokens and hide state-handling bugs."""
    import torch
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.log(torch.empty_like(p).uniform_(0.02, 0.1)))
        elif name.endswith("dt_bias"):
            p.copy_(0.3 * torch.randn_like(p))


def _build(tmp_path_factory, name: str, vl: bool, tied: bool, tokenizer_dir=None, save_dtype: str = "float32",
           **text_overrides):
    """text_overrides change TEXT (e.g. the CUDA tests' head sizes); tokenizer_dir defaults to the
    genuine Qwen3 tokenizer (the vocabulary is 256 either way)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from openinfer.testing.hf_reference import build_hf_checkpoint
    out = tmp_path_factory.mktemp(name)
    text = {**TEXT, "tie_word_embeddings": tied, **text_overrides}
    tok = tokenizer_dir or genuine_qwen3_tokenizer_dir()
    if vl:
        # the builder's init std lands on the top-level config; the text model reads its own
        vision = {**VISION, "out_hidden_size": text["hidden_size"]}
        config = dict(text_config={**text, "initializer_range": 0.1}, vision_config=vision, tie_word_embeddings=tied)
        model = build_hf_checkpoint(out, "qwen3_5", config, auto_class="AutoModelForImageTextToText",
                                    adjust=long_memory, tokenizer_dir=tok, save_dtype=save_dtype)
    else:
        model = build_hf_checkpoint(out, "qwen3_5_text", text, adjust=long_memory, tokenizer_dir=tok,
                                    save_dtype=save_dtype)
    return out, model


@pytest.fixture(scope="session")
def untied(tmp_path_factory):
    return _build(tmp_path_factory, "qwen35-untied", vl=True, tied=False)


@pytest.fixture(scope="session")
def tied(tmp_path_factory):
    return _build(tmp_path_factory, "qwen35-tied", vl=True, tied=True)


@pytest.fixture(scope="session")
def text_only(tmp_path_factory):
    return _build(tmp_path_factory, "qwen35-text-only", vl=False, tied=False)
