"""Session fixtures of the Kimi tests: the tokenizer folder and the tiny checkpoints (kimi_tiny.py builds them)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimi_tiny import CORPUS, KIMI, RANKS, V3, VOCAB_SPECIALS, build_checkpoint, tokenizer_config, train_ranks, write_ranks


@pytest.fixture(scope="session")
def kimi_ranks() -> dict[bytes, int]:
    from openinfer_kimi_k2.tokenizer import KIMI_PATTERN
    return train_ranks(CORPUS, KIMI_PATTERN, RANKS - 256)


@pytest.fixture(scope="session")
def kimi_tokenizer_dir(tmp_path_factory, kimi_ranks) -> Path:
    out = tmp_path_factory.mktemp("kimi-tokenizer")
    write_ranks(out / "tiktoken.model", kimi_ranks)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(len(kimi_ranks)), ensure_ascii=False))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": len(kimi_ranks) + 2}))  # <|im_end|>
    return out


@pytest.fixture(scope="session")
def vocab(kimi_ranks) -> int:
    return len(kimi_ranks) + VOCAB_SPECIALS


@pytest.fixture(scope="session")
def v3_grouped(tmp_path_factory, kimi_tokenizer_dir, vocab):
    return build_checkpoint(tmp_path_factory, kimi_tokenizer_dir, vocab, "v3-grouped", V3)


@pytest.fixture(scope="session")
def v3_kimi(tmp_path_factory, kimi_tokenizer_dir, vocab):
    return build_checkpoint(tmp_path_factory, kimi_tokenizer_dir, vocab, "v3-kimi", KIMI)


@pytest.fixture(scope="session")
def kimi_int4(tmp_path_factory, kimi_tokenizer_dir, vocab):
    return build_checkpoint(tmp_path_factory, kimi_tokenizer_dir, vocab, "kimi-int4", KIMI, "int4")


@pytest.fixture(scope="session")
def kimi_fp8(tmp_path_factory, kimi_tokenizer_dir, vocab):
    return build_checkpoint(tmp_path_factory, kimi_tokenizer_dir, vocab, "kimi-fp8", KIMI, "fp8")

