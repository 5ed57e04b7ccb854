"""Kimi's tokenizer from a checkpoint folder: `tiktoken.model` + `tokenizer_config.json`, as the checkpoints'
`tokenization_kimi.py` (TikTokenTokenizer) defines it, converted to an exact HF BPE (openinfer.text.tiktoken_bpe) and
cached on disk; a folder with a converted `tokenizer.json` loads as any other.

What tokenization_kimi.py does, reproduced here: the ranks are ids 0 .. n-1; 256 special ids follow, from n, named
by tokenizer_config.json's added_tokens_decoder or `<|reserved_token_{id}|>`; text is pre-tokenized with Kimi's
regex (a Han run first, Han out of the cased-letter classes, digits in runs of at most 3); before that, the text
is cut into pieces of at most 400,000 characters, and inside a piece every run of characters of one
`str.isspace()` class is cut after each 25,000 of its characters; each piece is encoded alone with every special
token recognised (its encode without arguments: `allowed_special="all"`).

Decoding keeps the chat-structure markers (tool-call section tokens, `<think>`) in the text even when special
tokens are skipped, so the output parsers see them.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Iterator

from tokenizers import Tokenizer as HFTokenizer

from openinfer.plugin_api import Tokenizer, cache_root, write_atomic
from openinfer.plugin_api import bpe_tokenizer_json, load_ranks

KIMI_PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
NUM_RESERVED_SPECIAL = 256
MAX_ENCODE_CHARS = 400_000        # tokenization_kimi.TIKTOKEN_MAX_ENCODE_CHARS
MAX_RUN_CHARS = 25_000            # MAX_NO_WHITESPACES_CHARS
# markers the output parsers need in the decoded text (KimiChatFormat)
OUTPUT_MARKERS = frozenset({"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                            "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>"})

# the characters of python's str.isspace(), which the reference's cuts use (all lie below U+3001)
_SPACES = re.escape("".join(chr(c) for c in range(0x3001) if chr(c).isspace()))
_RUNS = re.compile(f"[{_SPACES}]+|[^{_SPACES}]+")


def kimi_pieces(text: str) -> Iterator[str]:
    """The pieces tokenization_kimi.py encodes separately (its 400,000-character chunks and
    _split_whitespaces_or_nonwhitespaces)."""
    for i in range(0, max(len(text), 1), MAX_ENCODE_CHARS):
        chunk, start = text[i: i + MAX_ENCODE_CHARS], 0
        if len(chunk) > MAX_RUN_CHARS:
            for run in _RUNS.finditer(chunk):
                for cut in range(run.start() + MAX_RUN_CHARS, run.end(), MAX_RUN_CHARS):
                    yield chunk[start:cut]
                    start = cut
        yield chunk[start:]


def special_tokens(num_base: int, config: dict) -> list[tuple[int, str, bool]]:
    """(id, name, special) of the 256 ids after the ranks, `special` as tokenizer_config.json flags it."""
    named = {int(i): t for i, t in (config.get("added_tokens_decoder") or {}).items()}
    out = []
    for i in range(num_base, num_base + NUM_RESERVED_SPECIAL):
        entry = named.get(i) or {}
        name = entry.get("content") or f"<|reserved_token_{i}|>"
        out.append((i, name, bool(entry.get("special", False))))
    unknown = sorted(i for i in named if not num_base <= i < num_base + NUM_RESERVED_SPECIAL)
    if unknown:
        raise ValueError(f"tokenizer_config.json names added tokens {unknown[:5]} outside the special ids "
                         f"{num_base} .. {num_base + NUM_RESERVED_SPECIAL - 1} that follow tiktoken.model's ranks")
    return out


class KimiTokenizer(Tokenizer):
    """Encodes piece by piece as tokenization_kimi.py does; everything else is the core Tokenizer's."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if len(text) <= MAX_RUN_CHARS:   # no cut can fall inside
            return super().encode(text, add_special_tokens)
        ids: list[int] = []
        for piece in kimi_pieces(text):
            ids += super().encode(piece, add_special_tokens and not ids)
        return ids


def _converted(model: Path, config: dict) -> HFTokenizer:
    """The HF tokenizer of tiktoken.model + the config's special tokens, from the disk cache (keyed by both) or
    converted now (a few seconds for Kimi's 163,584 ranks) and cached."""
    data = model.read_bytes()
    specials = json.dumps(config.get("added_tokens_decoder") or {}, sort_keys=True)
    key = hashlib.sha256(data + specials.encode() + KIMI_PATTERN.encode()).hexdigest()[:24]
    path = cache_root() / "tokenizers" / f"kimi-{key}.json"
    if path.is_file():
        return HFTokenizer.from_file(str(path))
    ranks = load_ranks(model)
    text = json.dumps(bpe_tokenizer_json(ranks, KIMI_PATTERN, special_tokens(len(ranks), config)),
                      ensure_ascii=False)
    try:
        write_atomic(path, text.encode("utf-8"))
    except OSError:
        pass
    return HFTokenizer.from_str(text)


def _markers_kept(tok: Tokenizer) -> Tokenizer:
    """The chat-structure markers stay in decoded text even where special tokens are skipped (the parsers read
    them; tokenizer_config.json flags them special)."""
    tok.special_ids = frozenset(i for i in tok.special_ids if tok.id_to_token(i) not in OUTPUT_MARKERS)
    return tok


def load_kimi_tokenizer(path: Path) -> Tokenizer:
    path = Path(path)
    if (path / "tokenizer.json").is_file() or (path / "tokenizer.json.gz").is_file():
        return _markers_kept(Tokenizer.from_dir(path))
    model = path / "tiktoken.model"
    if not model.is_file():
        raise FileNotFoundError(f"no tiktoken.model (nor a converted tokenizer.json) in {path}: Kimi checkpoints "
                                "ship their vocabulary as tiktoken.model beside tokenizer_config.json")
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    return _markers_kept(KimiTokenizer.with_folder(_converted(model, config), path))
