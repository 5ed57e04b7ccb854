"""Structured outputs: a JSON Schema, a regular expression, a list of choices or a context-free grammar
(Lark or GBNF; an OutputGrammar) compiled by llguidance into one token matcher per request.

The server compiles (`compile_grammar`, in a worker thread, before submit: a bad or too complex grammar
is the client's 400, never an engine error); the engine asks each constrained request's Constraint
for the next token's allow mask, samples on the host among the allowed tokens, and feeds the token
back. llguidance is imported on the first structured request only, so `openinfer serve` starts
and idles without it; its tokenizer (our vocabulary as raw bytes, ~2 s for 150k tokens) is built
once per tokenizer, vocabulary size and eos set, and cached.

Reasoning lines (a ReasoningGate): where the prompt opened the reasoning block the output is free
until the model writes the end marker, and the grammar applies to the answer after it. Where the
model may open the block itself (Qwen3 with thinking on), its first token is the grammar's or the
block's opener: a model that does not reason is constrained from its first token, never left free.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..text.tokenizer import Tokenizer

# Used unless the schema carries llguidance's own "x-guidance" options: compact JSON, as OpenAI's structured outputs
# write it. Free whitespace between JSON tokens lets a model spend its whole budget on newlines and tabs (the failure
# vLLM's disable_any_whitespace works around), so none is allowed.
JSON_COMPACT_LAYOUT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
_build_lock = threading.Lock()


class GrammarError(ValueError):
    """A schema llguidance cannot compile (invalid, unsatisfiable, or over its complexity limits)."""


@dataclass
class _Vocab:
    """What llguidance's TokenizerWrapper reads: every id's raw bytes, the specials, a tokenize call."""
    tokenizer: Tokenizer
    tokens: list[bytes]
    eos_token_id: int
    bos_token_id: int | None
    special_token_ids: list[int]

    def __call__(self, text: bytes) -> list[int]:
        return self.tokenizer.encode(text.decode("utf-8", "replace"))


def grammar_tokenizer(tokenizer: Tokenizer, vocab_size: int, eos_ids: frozenset[int]) -> Any:
    """llguidance's LLTokenizer for this vocabulary, built once (under a lock: the first structured
    requests may arrive together) and cached."""
    with _build_lock:
        return _build_tokenizer(tokenizer, vocab_size, tuple(sorted(eos_ids)))


@lru_cache(maxsize=8)
def _build_tokenizer(tokenizer: Tokenizer, vocab_size: int, eos_ids: tuple[int, ...]) -> Any:
    import llguidance
    # ids past the tokenizer's vocabulary (the model's padded rows) are empty: never allowed
    n = tokenizer.vocab_size
    tokens = [bytes(tokenizer.token_bytes(i)) if i < n else b"" for i in range(vocab_size)]
    vocab = _Vocab(tokenizer, tokens, eos_ids[0], tokenizer.bos_token_id, sorted(tokenizer.special_ids))
    # every eos id ends a finished grammar (Qwen3 ends a chat turn with <|im_end|>, text with <|endoftext|>)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab), n_vocab=vocab_size, eos_token=list(eos_ids))


@dataclass(frozen=True)
class ReasoningGate:
    """Where reasoning may come before the answer: the grammar applies after the `end` marker's ids.
    `start` (the opener's one token id) is set when the output itself may open the block."""
    end: tuple[int, ...]
    start: int | None = None


def reasoning_gate(chat_format: Any, prompt_text: str, tokenizer: Tokenizer) -> ReasoningGate | None:
    """The gate of a chat prompt on this line, or None when the answer comes first (no reasoning, or
    the prompt closed the block). A multi-token opener cannot be offered beside the grammar's first
    token: the answer is then constrained from the start, as the client asked."""
    if not chat_format.reasoning_ahead(prompt_text):
        return None
    end = tuple(tokenizer.encode(chat_format.think_end))
    if chat_format.starts_in_reasoning(prompt_text):
        return ReasoningGate(end)
    start = tokenizer.encode(chat_format.think_start)
    return ReasoningGate(end, start[0]) if len(start) == 1 else None


@dataclass(frozen=True)
class OutputGrammar:
    """What an output must match: kind "json" (value: a JSON Schema), "regex" (a pattern, Rust regex
    syntax as llguidance reads it), "choice" (value: the strings, one of which is the whole output) or
    "grammar" (value: a context-free grammar in Lark syntax, or in llama.cpp's GBNF as vLLM's clients write
    it, `root ::= ...`; llguidance converts GBNF). `param` is the request field that asked, for its errors."""
    kind: str
    value: Any
    param: str = "response_format"


# JSON laid out as chat templates write it (their tojson: Python's json.dumps separators, on one line)
JSON_DUMPS_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def lark_literal(text: str) -> str:
    """`text` as a string literal of llguidance's Lark syntax (a JSON string: the same escapes)."""
    return json.dumps(text, ensure_ascii=False)


def lark_json(schema: dict[str, Any], layout: dict[str, Any] | None = None) -> str:
    """A Lark item matching JSON valid against `schema`, laid out as llguidance's "x-guidance" options `layout`
    say (default: compact, as for the JSON formats) unless the schema carries its own."""
    options = layout or JSON_COMPACT_LAYOUT
    return "%json " + json.dumps(schema if "x-guidance" in schema else {**schema, "x-guidance": options})


def _literal(text: str) -> str:
    """`text` as a regex matching itself: ASCII punctuation and spaces as \\x{..} escapes."""
    return "".join(c if c.isalnum() or not c.isascii() else f"\\x{{{ord(c):x}}}" for c in text)


def _grammar(spec: OutputGrammar) -> str:
    from llguidance import LLMatcher
    if spec.kind == "json":
        return LLMatcher.grammar_from_json_schema(
            spec.value, defaults=None if "x-guidance" in spec.value else JSON_COMPACT_LAYOUT)
    if spec.kind == "regex":
        return LLMatcher.grammar_from_regex(spec.value)
    if spec.kind == "grammar":
        from llguidance import grammar_from
        return grammar_from("grammar", spec.value)
    return LLMatcher.grammar_from_regex("(" + "|".join(map(_literal, spec.value)) + ")")


PROBE_TOKENS = 4   # tokens of a trial output walked at compile time (see _probe)


def compile_grammar(engine: Any, spec: OutputGrammar, count: int,
                    gate: ReasoningGate | None = None) -> list[Constraint]:
    """`count` fresh constraints (one per choice) for `spec` over the engine's vocabulary. Raises
    GrammarError for a grammar llguidance rejects, or one that fails on a trial output's first tokens (what
    compiles may still fail when it first computes a mask or lexes a token); its parser limits bound the work
    per step."""
    import llguidance
    if not engine.eos_token_ids:
        raise GrammarError(f"structured outputs need an end-of-sequence token the model can emit, and this "
                           f"tokenizer has none inside the model's {engine.vocab_size}-token vocabulary")
    tok = grammar_tokenizer(engine.tokenizer, engine.vocab_size, engine.eos_token_ids)
    try:
        grammar = _grammar(spec)
        first = llguidance.LLMatcher(tok, grammar, log_level=0,
                                     limits=llguidance.LLParserLimits(verbose_errors=False))
    except Exception as e:  # noqa: BLE001 — whatever llguidance raises on what a client sent is the client's error
        raise GrammarError(f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)) from None
    if first.is_error():
        raise GrammarError(first.get_error())
    _probe(first.deep_copy(), engine.vocab_size, engine.eos_token_ids)
    matchers = [first] + [first.deep_copy() for _ in range(count - 1)]
    return [Constraint(m, engine.vocab_size, gate) for m in matchers]


def _probe(matcher: Any, vocab_size: int, eos_ids: frozenset[int]) -> None:
    """Walk a trial output (each step's first allowed token other than eos) for PROBE_TOKENS tokens on a copy
    of the matcher, raising GrammarError where it fails: a grammar that allows no first token, or whose lexer
    gives up on its first lexeme, is the request's 400 instead of an error event after a 200."""
    for _ in range(PROBE_TOKENS):
        c = Constraint(matcher, vocab_size)
        c.prepare()
        if c.error is not None:
            raise GrammarError(c.error)
        allowed = np.flatnonzero(c.mask)
        nxt = next((int(t) for t in allowed if int(t) not in eos_ids), None)
        if nxt is None:
            return   # only eos may follow: the output is complete
        if c.advance(nxt):
            return
        if c.error is not None:
            raise GrammarError(c.error)


@dataclass
class Constraint:
    """One request's grammar state. The engine calls prepare() when it launches a step that samples
    the request (the mask is computed while the device runs), reads `mask` to sample, then advance()."""
    matcher: Any                              # llguidance.LLMatcher
    vocab_size: int
    gate: ReasoningGate | None = None         # None once the grammar applies
    mask: np.ndarray | None = None            # [vocab_size] bool: the next token's allowed ids; None: free
    error: str | None = None                  # set once the matcher failed: the request must fail
    _reasoning: bool = False                  # inside the block: free until gate.end
    _tail: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._reasoning = self.gate is not None and self.gate.start is None   # the prompt opened the block

    def prepare(self) -> None:
        """The next token's mask (none while reasoning). A matcher error is recorded, never raised:
        this runs for a whole step's rows."""
        if self._reasoning or self.mask is not None or self.error is not None:
            return
        try:
            bits = np.frombuffer(self.matcher.compute_bitmask(), np.uint8)
        except Exception as e:  # noqa: BLE001 — llguidance raises only on API misuse; fail the request
            self.error = f"{type(e).__name__}: {e}"
            return
        mask = np.unpackbits(bits, count=self.vocab_size, bitorder="little").view(bool)
        if self.matcher.is_error() or not mask.any():
            self.error = self.matcher.get_error() or "the grammar allows no next token"
            return
        if self.gate is not None:   # the first token: the answer's, or the reasoning block's opener
            mask[self.gate.start] = True
        self.mask = mask

    def advance(self, token: int) -> bool:
        """Feed the sampled token; True when the grammar is complete (only eos could follow).
        A token the matcher refuses sets `error`."""
        self.mask = None
        if self._reasoning:
            end = self.gate.end
            self._tail = (self._tail + [token])[-len(end):]
            if tuple(self._tail) == end:
                self._reasoning, self.gate = False, None   # the answer starts: constrain from the next token on
            return False
        if self.gate is not None:   # the first token of a line that may reason
            if token == self.gate.start:
                self._reasoning = True
                return False
            self.gate = None
        if not self.matcher.consume_token(token):
            self.error = self.matcher.get_error() or f"token {token} is outside the grammar"
            return False
        return self.matcher.is_stopped()
