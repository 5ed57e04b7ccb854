"""Kimi's tokenizer read from tiktoken.model + tokenizer_config.json against tiktoken driven as the reference
tokenization_kimi.py drives it (its pattern, its special ids, its 400,000 / 25,000-character cuts), on a small
ranks file of the tests' own."""
from __future__ import annotations

import json

import pytest

from openinfer.plugin_api import bpe_tokenizer_json
from openinfer_kimi_k2 import tokenizer as kt

from kimi_tiny import SPECIALS, tokenizer_config

TEXTS = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", " 中文", "A中B", "x々y", "1〇〇〇", "camelCase",
    "HTMLParser", "!\n/x", "\x1c\x1c a", "don't", "한국ABC", "中文字。日本語です", "０１２３", "it'ſ", "'llama", "1's",
    "\u0301A!", "!!\u0301", "  \n\n  leading and trailing  \n", "tabs\tand\u3000ideographic\u00a0spaces",
    "<|im_user|>user<|im_middle|>hi<|im_end|>", "a<think>b</think>c[BOS]", "<|reserved_token_163700|>",
    "functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}", "Ünïcödé àccents 3.14159",
    "emoji 😀 and bytes \udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
]


def reference_pieces(text: str):
    """tokenization_kimi.TikTokenTokenizer's chunks and _split_whitespaces_or_nonwhitespaces, verbatim."""
    for i in range(0, len(text), 400_000):
        s = text[i: i + 400_000]
        current_slice_len = 0
        current_slice_is_space = s[0].isspace() if len(s) > 0 else False
        slice_start = 0
        for j in range(len(s)):
            is_now_space = s[j].isspace()
            if current_slice_is_space ^ is_now_space:
                current_slice_len = 1
                current_slice_is_space = is_now_space
            else:
                current_slice_len += 1
                if current_slice_len > 25_000:
                    yield s[slice_start:j]
                    slice_start = j
                    current_slice_len = 1
        yield s[slice_start:]


@pytest.fixture(scope="module")
def reference(kimi_ranks):
    tiktoken = pytest.importorskip("tiktoken")
    n = len(kimi_ranks)
    specials = {SPECIALS.get(i - n, f"<|reserved_token_{i}|>"): i for i in range(n, n + 256)}
    enc = tiktoken.Encoding("kimi-test", pat_str=kt.KIMI_PATTERN, mergeable_ranks=kimi_ranks, special_tokens=specials)

    def encode(text: str) -> list[int]:
        return [t for piece in reference_pieces(text) for t in enc.encode(piece, allowed_special="all")]
    return enc, encode


@pytest.fixture(scope="module")
def tok(kimi_tokenizer_dir, tmp_path_factory, monkeypatch_module):
    return kt.load_kimi_tokenizer(kimi_tokenizer_dir)


@pytest.fixture(scope="module")
def monkeypatch_module(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("OPENINFER_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    yield mp
    mp.undo()


def test_encode_matches_tiktoken(tok, reference):
    _, ref = reference
    reserved = TEXTS[23].replace("163700", str(tok.token_to_id("[BOS]") + 116))   # a reserved name of this vocabulary
    for text in [*TEXTS, reserved, "\n".join(TEXTS), " ".join(TEXTS) * 3]:
        assert tok.encode(text) == ref(text), repr(text)


def test_long_runs_are_cut_as_the_reference_cuts(tok, reference):
    """Runs of one isspace() class longer than 25,000 characters: the cut falls inside them (and inside a special
    token's name when the run reaches it, which is then plain text), exactly where the reference's falls."""
    _, ref = reference
    cases = ["a" * 24998 + "[BOS]" + "b" * 10, "a" * 24990 + "[BOS]" + "b" * 10, "a" * 30000 + " tail",
             " " * 26000 + "x" + "\x1c" * 30 + "y", "中" * 25001 + "文 end", "ab " * 9000 + "c" * 51000 + "  \n"]
    for text in cases:
        assert tok.encode(text) == ref(text), f"{text[:20]!r}... ({len(text)} chars)"
    assert list(kt.kimi_pieces("a" * 50001)) == list(reference_pieces("a" * 50001))


def test_decode_and_special_flags(tok, reference, kimi_ranks):
    enc, ref = reference
    for text in TEXTS:
        ids = ref(text)
        assert tok.decode(ids, skip_special_tokens=False) == enc.decode(ids)
    n = len(kimi_ranks)
    assert tok.token_to_id("[BOS]") == n and tok.vocab_size == n + 256
    assert tok.eos_token_ids == {n + 1, n + 2}   # [EOS] (tokenizer_config) and <|im_end|> (generation_config)
    ids = tok.encode("[BOS]<think>why</think><|tool_calls_section_begin|>x<|im_end|>")
    # the chat-structure markers the parsers read survive skip_special_tokens; the others go
    assert tok.decode(ids) == "<think>why</think><|tool_calls_section_begin|>x"
    assert tok.id_to_token(n + 100) == f"<|reserved_token_{n + 100}|>"


def test_converted_tokenizer_json_folder_loads(tmp_path, kimi_ranks, tok):
    n = len(kimi_ranks)
    specials = kt.special_tokens(n, tokenizer_config(n))
    (tmp_path / "tokenizer.json").write_text(json.dumps(bpe_tokenizer_json(kimi_ranks, kt.KIMI_PATTERN, specials)))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(n)))
    converted = kt.load_kimi_tokenizer(tmp_path)
    assert type(converted).__name__ == "Tokenizer"
    for text in TEXTS:
        assert converted.encode(text) == tok.encode(text)


def test_folder_without_a_vocabulary_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="tiktoken.model"):
        kt.load_kimi_tokenizer(tmp_path)


def test_added_tokens_outside_the_special_range_are_refused():
    with pytest.raises(ValueError, match="outside the special ids"):
        kt.special_tokens(100, {"added_tokens_decoder": {"5": {"content": "x"}}})
