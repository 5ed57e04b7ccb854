"""Streaming text out: incremental detokenization and stop-string matching.

Both are per-choice state machines fed as tokens arrive; both hold back text that is not final
yet (an incomplete UTF-8 character, a possible start of a stop string) and release it on flush().
"""
from __future__ import annotations

from typing import Protocol


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


def partial_suffix_len(text: str, patterns: list[str] | tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `patterns`:
    the part a streaming matcher must hold back because the next delta may complete a pattern."""
    best = 0
    for pattern in patterns:
        for n in range(min(len(pattern) - 1, len(text)), best, -1):
            if text.endswith(pattern[:n]):
                best = n
                break
    return best


class IncrementalDetokenizer:
    """Turns a growing token sequence into text deltas.

    Like vLLM, only a short window is re-decoded: tokens[prefix_offset:read_offset] were already
    emitted and give context (SentencePiece drops a leading space at the start of a decode), and
    tokens[read_offset:] are new. Text ending in U+FFFD is an incomplete multi-byte character and
    waits for the next token; flush() releases it at the end of generation.
    """

    def __init__(self, tokenizer: _Decoder, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=self.skip_special_tokens)

    def _advance(self, final: bool) -> str:
        prefix_text = self._decode(self.prefix_offset, self.read_offset)
        new_text = self._decode(self.prefix_offset)
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not final):
            return ""
        delta = new_text[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.text += delta
        return delta

    def add(self, token_ids: list[int]) -> str:
        """Append new tokens; return the text that became final."""
        self.token_ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """End of generation: release a held-back incomplete character (decoded as U+FFFD)."""
        return self._advance(final=True)


class StopStringMatcher:
    """Cuts the output stream at the first stop string; stop text never reaches the client
    unless include_stop. The first match is the one that ends earliest (what a token-by-token
    check would see first); among those, the one that starts earliest, so no part of any stop
    string is emitted. The result does not depend on how the text was split into deltas."""

    def __init__(self, stops: list[str], include_stop: bool = False) -> None:
        self.stops = [s for s in dict.fromkeys(stops) if s]
        self.include_stop = include_stop
        self.matched = False
        self._held = ""

    def _first_match(self, text: str) -> tuple[int, int] | None:
        best: tuple[int, int] | None = None  # (end, start)
        for stop in self.stops:
            i = text.find(stop)
            if i >= 0 and (best is None or (i + len(stop), i) < best):
                best = (i + len(stop), i)
        return best

    def feed(self, delta: str) -> tuple[str, bool]:
        """Returns (text safe to emit now, whether a stop string matched). After a match the
        caller stops generation; further feeds return ("", True)."""
        if self.matched:
            return "", True
        if not self.stops:
            return delta, False
        text = self._held + delta
        if (match := self._first_match(text)) is not None:
            end, start = match
            self.matched, self._held = True, ""
            return text[:end if self.include_stop else start], True
        keep = partial_suffix_len(text, self.stops)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def flush(self) -> str:
        """End of generation without a match: the held-back tail is ordinary text."""
        held, self._held = self._held, ""
        return held
