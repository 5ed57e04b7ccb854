"""A small GLM-style tokenizer (byte-level BPE with GLM's special and tag tokens) and tiny random GLM-5.x
checkpoints built with transformers, shared by the glm52 tests."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from openinfer_glm52.chat import CHAT_TEMPLATE

# GLM's turn markers are special tokens (dropped when decoding); its think and tool tags are not, so the
# parsers see them in the text, as with the real vocabulary.
SPECIAL = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
        "</arg_value>", "<tool_response>", "</tool_response>"]
CORPUS = ["The weather in Paris is sunny today, 23 degrees.", "Name three prime numbers: 2, 3 and 5.",
          "You are a helpful assistant. Answer briefly.", '{"city": "Paris", "days": [1, 2]} get_weather city',
          "天气 🌤 — the user wants the weather forecast for tomorrow."]


def build_glm_tokenizer(out: Path, vocab_size: int = 700) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIAL) - len(TAGS), special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.add_tokens(TAGS)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "special": t in SPECIAL} for t in SPECIAL + TAGS}
    (out / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added,
                                                           "eos_token": "<|endoftext|>"}))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE.read_text())
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [tok.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]}))
    return out


@pytest.fixture(scope="session")
def glm_tokenizer_dir(tmp_path_factory) -> Path:
    return build_glm_tokenizer(tmp_path_factory.mktemp("glm-tokenizer"))
