"""tiktoken ranks -> an exact Hugging Face BPE tokenizer.json (for vocabularies published as tiktoken files).

tiktoken encodes a pre-tokenized piece by taking it whole if it is a token, else by repeatedly merging the adjacent
pair whose concatenation has the lowest rank (the leftmost on ties). An HF BPE reproduces that when (a)
`ignore_merges` is on (whole-piece lookup first) and (b) the merge list holds *every* split (a, b) of every token t
with a and b in the vocabulary, ordered by rank(t): a merge whose result is t must fire exactly when tiktoken would
form t, whichever parts it is formed from. The usual "one merge per token" conversion keeps a single split per token
and disagrees with the ranks wherever a token is not reachable through lower-ranked pairs.
"""
from __future__ import annotations

import base64
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from .tokenizer import byte_level_chars


def load_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken ranks file: one `base64(token) rank` per line (tiktoken's load_tiktoken_bpe)."""
    ranks = {}
    for line in Path(path).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@lru_cache(maxsize=1)
def _byte_to_char() -> tuple[str, ...]:
    return byte_level_chars()


def byte_level(token: bytes) -> str:
    chars = _byte_to_char()
    return "".join(chars[b] for b in token)


def bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every split of every multi-byte token into two tokens, by the rank of the token; splits of one token by the
    length of their left part (tiktoken breaks such ties by position instead; that could only matter for two
    overlapping candidate pairs forming the same token)."""
    out = []
    for token, rank in ranks.items():
        for k in range(1, len(token)):
            if token[:k] in ranks and token[k:] in ranks:
                out.append((rank, k, token[:k], token[k:]))
    out.sort()
    return [(a, b) for _, _, a, b in out]


def bpe_tokenizer_json(ranks: dict[bytes, int], pattern: str, added: Iterable[tuple[int, str, bool]],
                       normalizer: dict[str, Any] | None = None) -> dict[str, Any]:
    """tokenizer.json of the ranks (ids = ranks, which must be 0 .. n-1) with `pattern` as the pre-tokenizer's
    split regex and `added` (id, content, special) tokens matched before it."""
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"tiktoken ranks must be the ids 0 .. {len(ranks) - 1} without gaps")
    byte_level_opts = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": special} for i, t, special in added],
        "normalizer": normalizer,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", **byte_level_opts},
        ]},
        "post_processor": {"type": "ByteLevel", **byte_level_opts},
        "decoder": {"type": "ByteLevel", **byte_level_opts},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
            "vocab": {byte_level(t): r for t, r in sorted(ranks.items(), key=lambda kv: kv[1])},
            "merges": [[byte_level(a), byte_level(b)] for a, b in bpe_merges(ranks)],
        },
    }
