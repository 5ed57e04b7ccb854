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


# hidden 64, 4 layers (0 dense, 1-3 MoE), indexer full, full, shared, full; index_topk 4 < every prompt
TINY = dict(vocab_size=768, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
            routed_scaling_factor=2.5, first_k_dense_replace=1, index_n_heads=16, index_head_dim=16, index_topk=4,
            index_topk_freq=2, index_skip_topk_offset=2, rms_norm_eps=1e-5, max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 8e6}, tie_word_embeddings=False)


def _build(tmp_path_factory, tokenizer_dir: Path, name: str, **overrides):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from openinfer.testing.hf_reference import build_hf_checkpoint
    out = tmp_path_factory.mktemp(name)
    model = build_hf_checkpoint(out, "glm_moe_dsa", {**TINY, **overrides}, tokenizer_dir=tokenizer_dir)
    return out, model


@pytest.fixture(scope="session")
def sparse(tmp_path_factory, glm_tokenizer_dir):
    """index_topk 4: attention is sparse beyond the fourth token; full and shared indexer layers."""
    return _build(tmp_path_factory, glm_tokenizer_dir, "glm-sparse")


@pytest.fixture(scope="session")
def dense(tmp_path_factory, glm_tokenizer_dir):
    """index_topk 512, more than any prompt: DSA selects every key, attention is plain MLA."""
    return _build(tmp_path_factory, glm_tokenizer_dir, "glm-dense", index_topk=512)
