"""A small Kimi tokenizer folder of the tests' own (tiktoken ranks trained on a fixed text, Kimi's special tokens and
chat template), and tiny random DeepSeek-V3 / Kimi checkpoints built with transformers."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

# the special tokens of Kimi-K2's tokenizer_config.json, by offset from the first id after the ranks
SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>", 6: "<|start_header_id|>",
            7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>", 11: "<|tool_calls_section_begin|>",
            12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>",
            15: "<|tool_call_end|>", 17: "<|im_middle|>", 22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]"}

# Kimi-K2-Instruct's chat template (as shipped in its tokenizer_config.json)
CHAT_TEMPLATE = """{%- if tools -%}
  <|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>
{%- endif -%}
{%- for message in messages -%}
  {%- if loop.first and messages[0]['role'] != 'system' -%}
    <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>
  {%- endif -%}
  {%- set role_name =  message.get('name') or  message['role'] -%}
  {%- if message['role'] == 'user' -%}
    <|im_user|>{{role_name}}<|im_middle|>
  {%- elif message['role'] == 'assistant' -%}
    <|im_assistant|>{{role_name}}<|im_middle|>
  {%- else -%}
    <|im_system|>{{role_name}}<|im_middle|>
  {%- endif -%}
  {%- if message['role'] == 'assistant' and message.get('tool_calls') -%}
    {%- if message['content'] -%}{{ message['content'] }}{%- endif -%}
    <|tool_calls_section_begin|>
    {%- for tool_call in message['tool_calls'] -%}
      {%- set formatted_id = tool_call['id'] -%}
      <|tool_call_begin|>{{ formatted_id }}<|tool_call_argument_begin|>{% if tool_call['function']['arguments'] is string %}{{ tool_call['function']['arguments'] }}{% else %}{{ tool_call['function']['arguments'] | tojson }}{% endif %}<|tool_call_end|>
    {%- endfor -%}
    <|tool_calls_section_end|>
  {%- elif message['role'] == 'tool' -%}
    ## Return of {{ message.tool_call_id }}
{{ message['content'] }}
  {%- elif message['content'] is string -%}
    {{ message['content'] }}
  {%- endif -%}
  <|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}
  <|im_assistant|>assistant<|im_middle|>
{%- endif -%}"""

CORPUS = ("The quick brown fox jumps over the lazy dog. Name three prime numbers and explain why 1 is not prime. "
          "What is the weather in Paris today? It's sunny; don't forget HTMLParser and camelCase identifiers. "
          "中文字。日本語です。今日はいい天気ですね。北京的天气怎么样？ 한국어 텍스트입니다. Ünïcödé àccents. "
          "def get_weather(city):\n    return {\"city\": city, \"temp\": 21}\n\n0123456789 3.14159 2026-12-06 "
          "functions.get_weather:0 {\"city\": \"Paris\"} ## Return of You are Kimi, an AI assistant.\n")
RANKS = 420


def write_ranks(path: Path, ranks: dict[bytes, int]) -> None:
    path.write_bytes(b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n"
                              for t, r in sorted(ranks.items(), key=lambda kv: kv[1])))


def train_ranks(text: str, pattern: str, merges: int) -> dict[bytes, int]:
    """Byte-level BPE ranks: the 256 bytes, then up to `merges` most frequent adjacent pairs inside the pattern's
    pieces (ties by the pair's bytes, so every run trains the same ranks)."""
    import regex
    ranks = {bytes([b]): b for b in range(256)}
    words = [[bytes([b]) for b in piece.encode("utf-8")] for piece in regex.findall(pattern, text)]
    for _ in range(merges):
        counts: dict[tuple[bytes, bytes], int] = {}
        for w in words:
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        ranks[best[0] + best[1]] = len(ranks)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i: i + 2] = [best[0] + best[1]]
                i += 1
    return ranks


@pytest.fixture(scope="session")
def kimi_ranks() -> dict[bytes, int]:
    from openinfer_kimi_k2.tokenizer import KIMI_PATTERN
    return train_ranks(CORPUS, KIMI_PATTERN, RANKS - 256)


def tokenizer_config(n: int) -> dict:
    return {"added_tokens_decoder": {str(n + k): {"content": v, "special": True, "lstrip": False, "rstrip": False,
                                                  "normalized": False, "single_word": False}
                                     for k, v in SPECIALS.items()},
            "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
            "chat_template": CHAT_TEMPLATE, "tokenizer_class": "TikTokenTokenizer",
            "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}


@pytest.fixture(scope="session")
def kimi_tokenizer_dir(tmp_path_factory, kimi_ranks) -> Path:
    out = tmp_path_factory.mktemp("kimi-tokenizer")
    write_ranks(out / "tiktoken.model", kimi_ranks)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(len(kimi_ranks)), ensure_ascii=False))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": len(kimi_ranks) + 2}))  # <|im_end|>
    return out
