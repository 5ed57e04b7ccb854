"""Tiny random Qwen3 checkpoints built with transformers, shared by the fidelity tests."""
from __future__ import annotations

import pytest

from openinfer.testing.tokenizers import genuine_qwen3_tokenizer_dir

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, vocab_size=151936, max_position_embeddings=2048,
            rope_theta=1e6, rms_norm_eps=1e-6)


def _build(tmp_path_factory, name: str, **overrides):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from openinfer.testing.hf_reference import build_hf_checkpoint
    out = tmp_path_factory.mktemp(name)
    save_dtype = overrides.pop("save_dtype", "float32")
    model = build_hf_checkpoint(out, "qwen3", {**TINY, **overrides}, save_dtype=save_dtype,
                                tokenizer_dir=genuine_qwen3_tokenizer_dir())
    return out, model


@pytest.fixture(scope="session")
def tied(tmp_path_factory):
    return _build(tmp_path_factory, "qwen3-tied", tie_word_embeddings=True)


@pytest.fixture(scope="session")
def untied(tmp_path_factory):
    return _build(tmp_path_factory, "qwen3-untied", tie_word_embeddings=False)


@pytest.fixture(scope="session")
def yarn(tmp_path_factory):
    return _build(tmp_path_factory, "qwen3-yarn", tie_word_embeddings=False, max_position_embeddings=4096,
                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})


@pytest.fixture(scope="session")
def bf16(tmp_path_factory):
    return _build(tmp_path_factory, "qwen3-bf16", tie_word_embeddings=True, save_dtype="bfloat16")
