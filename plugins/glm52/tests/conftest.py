"""A small GLM-style tokenizer (byte-level BPE with GLM's special and tag tokens) and tiny random GLM-5.x
checkpoints built with transformers, shared by the glm52 tests."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from openinfer_glm52.chat import CHAT_TEMPLATE
from glm52_tiny import TINY

# GLM's turn markers are special tokens (dropped when decoding); its think and tool tags are not, so the
# parsers see them in the text, as with the real vocabulary.
SPECIAL = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
        "</arg_value>", "<tool_response>", "</tool_response>"]


def build_glm_tokenizer(out: Path) -> Path:
    """A tokenizer folder: the tiny byte-level BPE of openinfer.testing with GLM's tokens, its chat template and
    the stop tokens in generation_config.json."""
    from openinfer.testing.tokenizers import tiny_bpe_tokenizer_dir
    tokens = SPECIAL + TAGS   # ids 0, 1, ... in this order
    added = {str(i): {"content": t, "special": t in SPECIAL} for i, t in enumerate(tokens)}
    tiny_bpe_tokenizer_dir(out, tokens, {"added_tokens_decoder": added, "eos_token": "<|endoftext|>"})
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE.read_text())
    stops = [tokens.index(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    return out


@pytest.fixture(scope="session")
def glm_tokenizer_dir(tmp_path_factory) -> Path:
    return build_glm_tokenizer(tmp_path_factory.mktemp("glm-tokenizer"))


def _build(tmp_path_factory, tokenizer_dir: Path, name: str, adjust=None, **overrides):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from openinfer.testing.hf_reference import build_hf_checkpoint
    out = tmp_path_factory.mktemp(name)
    model = build_hf_checkpoint(out, "glm_moe_dsa", {**TINY, **overrides}, tokenizer_dir=tokenizer_dir, adjust=adjust)
    return out, model


@pytest.fixture(scope="session")
def sparse(tmp_path_factory, glm_tokenizer_dir):
    """index_topk 4: attention is sparse beyond the fourth token; full and shared indexer layers."""
    return _build(tmp_path_factory, glm_tokenizer_dir, "glm-sparse")


@pytest.fixture(scope="session")
def dense(tmp_path_factory, glm_tokenizer_dir):
    """index_topk 512, more than any prompt: DSA selects every key, attention is plain MLA."""
    return _build(tmp_path_factory, glm_tokenizer_dir, "glm-dense", index_topk=512)


@pytest.fixture(scope="session")
def fp8(tmp_path_factory, glm_tokenizer_dir):
    """A GLM-5-FP8 layout of the sparse model: its Linears FP8 with 128x128 block scales; the transformers
    reference holds the dequantized weights."""
    from glm52_tiny import quantize_fp8_in_place, write_fp8_checkpoint
    codes: dict = {}
    ckpt, model = _build(tmp_path_factory, glm_tokenizer_dir, "glm-fp8",
                         adjust=lambda m: codes.update(quantize_fp8_in_place(m)))
    write_fp8_checkpoint(ckpt, codes)
    return ckpt, model
