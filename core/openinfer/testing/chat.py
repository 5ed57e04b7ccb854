"""Checking a model line's chat format the way the server drives it: token by token."""
from __future__ import annotations

from typing import Any

from ..detokenize import IncrementalDetokenizer, StopStringMatcher
from ..parsers import ChatFormat, ParsedDelta
from ..tokenizer import Tokenizer


def stream_output(fmt: ChatFormat, tok: Tokenizer, prompt: str, ids: list[int], tools: list[dict[str, Any]],
                  stop: list[str] | None = None) -> ParsedDelta:
    """Output ids -> incremental detokenizer -> stop strings -> the format's stream parser, one
    token at a time, as the server streams a choice; asserts no stop string matched."""
    detok, stops = IncrementalDetokenizer(tok), StopStringMatcher(stop or [])
    parser, out = fmt.stream_parser(prompt, tools), ParsedDelta()
    for i in ids:
        text, matched = stops.feed(detok.add([i]))
        out.extend(parser.feed(text))
        assert not matched, f"stop string matched at token {i}"
    out.extend(parser.feed(stops.feed(detok.flush())[0] + stops.flush()))
    return out.extend(parser.finish())
