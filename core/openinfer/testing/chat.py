"""Checking a model line's chat format the way the server drives it: token by token."""
from __future__ import annotations

import random
from typing import Any

from ..detokenize import IncrementalDetokenizer, StopStringMatcher
from ..parsers import ChatFormat, ParsedDelta
from ..tokenizer import Tokenizer


def split_feed(parser: Any, text: str, rng: random.Random, max_cuts: int) -> ParsedDelta:
    """Feed `text` to a streaming parser in up to max_cuts + 1 random pieces, then finish it: the
    coalesced output must not depend on where the pieces break."""
    cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, max_cuts)))
    out, prev = ParsedDelta(), 0
    for cut in cuts + [len(text)]:
        out.extend(parser.feed(text[prev:cut]))
        prev = cut
    return out.extend(parser.finish())


def stream_output(fmt: ChatFormat, tok: Tokenizer, prompt: str, ids: list[int], tools: list[dict[str, Any]],
                  stop: list[str] | None = None, prefix: str = "") -> ParsedDelta:
    """Output ids -> incremental detokenizer -> stop strings -> the format's stream parser, one
    token at a time, as the server streams a choice; asserts no stop string matched. `prefix`: a forced tool
    call's opener, which ends the prompt."""
    detok, stops = IncrementalDetokenizer(tok), StopStringMatcher(stop or [])
    parser, out = fmt.stream_parser(prompt, tools, prefix), ParsedDelta()
    for i in ids:
        text, matched = stops.feed(detok.add([i]))
        out.extend(parser.feed(text))
        assert not matched, f"stop string matched at token {i}"
    out.extend(parser.feed(stops.feed(detok.flush())[0] + stops.flush()))
    return out.extend(parser.finish())
