"""Tiny random DeepSeek-V2 checkpoints built with transformers, with a tiny tokenizer folder carrying the
checkpoints' genuine chat template, shared by the line's tests."""
from __future__ import annotations

import pytest

from dsv2_tiny import BOS, EOS, FULL, TINY, TOKENIZER_CONFIG, VOCAB


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    from openinfer.testing.tokenizers import tiny_bpe_tokenizer_dir
    return tiny_bpe_tokenizer_dir(tmp_path_factory.mktemp("dsv2-tokenizer"), [BOS, EOS], TOKENIZER_CONFIG, VOCAB)


def build(tmp_path_factory, tokenizer_dir, name: str, config: dict, save_dtype: str = "float32"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from openinfer.testing.hf_reference import build_hf_checkpoint
    out = tmp_path_factory.mktemp(name)
    return out, build_hf_checkpoint(out, "deepseek_v2", config, tokenizer_dir=tokenizer_dir, save_dtype=save_dtype)


@pytest.fixture(scope="session")
def lite(tmp_path_factory, tokenizer_dir):
    return build(tmp_path_factory, tokenizer_dir, "dsv2-lite", TINY)


@pytest.fixture(scope="session")
def full(tmp_path_factory, tokenizer_dir):
    return build(tmp_path_factory, tokenizer_dir, "dsv2-full", FULL)


@pytest.fixture(scope="session")
def full_bf16(tmp_path_factory, tokenizer_dir):
    """Saved in bfloat16, as the real checkpoints are (the reference reloads the rounded weights)."""
    return build(tmp_path_factory, tokenizer_dir, "dsv2-full-bf16", FULL, save_dtype="bfloat16")
