"""Checking a model line's chat format the way the server drives it: token by token."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ..text.detokenize import IncrementalDetokenizer, StopStringMatcher
from ..text.parsers import ChatFormat, ParsedDelta
from ..text.tokenizer import Tokenizer


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


@dataclass
class _Vocab:
    """What structured.compile_grammar reads of an engine."""
    tokenizer: Tokenizer
    vocab_size: int
    eos_token_ids: frozenset[int]


def tool_call_grammar_run(fmt: ChatFormat, tok: Tokenizer, tools: list[dict[str, Any]], name: str | None,
                          output: str, parallel: bool = True) -> tuple[int, bool]:
    """A forced call's rest `output` fed token by token to the format's tool_call_grammar, as the engine
    samples under it: (the tokens the grammar allowed before one it refused, whether the output may end there)."""
    from ..sampling.structured import OutputGrammar, compile_grammar
    vocab = _Vocab(tok, tok.vocab_size, frozenset(tok.encode("<|im_end|>")))
    [c] = compile_grammar(vocab, OutputGrammar("grammar", fmt.tool_call_grammar(tools, name, parallel), "tools"), 1)
    ids = tok.encode(output)
    for i, t in enumerate(ids):
        c.prepare()
        if c.error or not c.mask[t]:
            return i, False
        c.advance(t)
    return len(ids), c.matcher.is_accepting()
