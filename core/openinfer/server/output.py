"""One choice's text pipeline: tokens -> IncrementalDetokenizer -> StopStringMatcher -> (chat) OutputParser.

The engine ends a request on eos / stop_token_ids; stop strings are ours: on a match the choice
ends with finish_reason "stop" (the caller aborts the engine request) and the stop text is never
emitted unless include_stop_str_in_output. The engine's stop token is dropped from the text for
the same reason (vLLM does the same). Stop strings count only once min_tokens were generated.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from openinfer.text.detokenize import IncrementalDetokenizer, StopStringMatcher
from openinfer.text.parsers import OutputParser, ParsedDelta
from openinfer.sampling.sampler import SampleResult, SamplingParams
from openinfer.text.tokenizer import Tokenizer

from .protocol import Generation


def finite(logprob: float) -> float:
    """A logprob for JSON, which has no -inf (vLLM clamps the same way)."""
    return max(logprob, -9999.0)


def token_namer(tokenizer: Tokenizer, gen: Generation) -> Callable[[int], str]:
    """How logprobs name a token: its text, or "token_id:N" (vLLM's return_tokens_as_token_ids)."""
    return (lambda t: f"token_id:{t}") if gen.tokens_as_ids else tokenizer.token_text


def vllm_prompt_logprobs(tokenizer: Tokenizer, samples: list[SampleResult], k: int) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: null for the first prompt token, then per token {id: {logprob, rank,
    decoded_token}} for the token itself and the k most likely."""
    text = tokenizer.token_text
    out: list[dict | None] = [None]
    for s in samples:
        entry = {str(s.token): {"logprob": finite(s.logprob), "rank": s.rank, "decoded_token": text(s.token)}}
        for rank, (t, lp) in enumerate((s.top or [])[:k], 1):
            entry.setdefault(str(t), {"logprob": finite(lp), "rank": rank, "decoded_token": text(t)})
        out.append(entry)
    return out


@dataclass
class Piece:
    """What one engine event added to one choice."""
    text: str = ""                                   # visible text after stop handling
    parsed: ParsedDelta | None = None                # chat: text split into reasoning / content / tool calls
    samples: list[tuple[SampleResult, int]] = field(default_factory=list)  # (logprobs, text offset)
    token_ids: list[int] = field(default_factory=list)   # the tokens it came from, when return_token_ids asks
    finish_reason: str | None = None

    def __bool__(self) -> bool:
        return bool(self.samples or self.token_ids or self.finish_reason
                    or (self.parsed if self.parsed is not None else self.text))


class ChoiceOutput:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: frozenset[int], gen: Generation,
                 params: SamplingParams, parser: OutputParser | None = None, calls_finish: bool = True) -> None:
        self.detok = IncrementalDetokenizer(tokenizer, gen.skip_special_tokens)
        self.stops = StopStringMatcher(gen.stop, gen.include_stop)
        self.include_stop = gen.include_stop
        eos = frozenset() if params.ignore_eos else eos_token_ids
        self.stop_ids = eos | set(params.stop_token_ids)
        self.min_tokens = params.min_tokens
        self.want_logprobs = params.logprobs is not None
        self.want_ids = gen.return_token_ids
        self.parser = parser
        # finish_reason "tool_calls" when calls were made; OpenAI keeps "stop" for a call it was told to make by
        # name (vLLM #25054 measured it), so a named tool_choice passes False
        self.calls_finish = calls_finish
        self.num_tokens = 0
        self.finish_reason: str | None = None
        # the whole output so far, for non-streaming responses
        self.text = ""
        self.parsed = ParsedDelta()
        self.samples: list[tuple[SampleResult, int]] = []
        self.token_ids: list[int] = []   # every token generated, when return_token_ids asks
        self.prompt_samples: list[SampleResult] | None = None   # the prompt scored (prompt logprobs), when asked

    def _visible(self, delta: str) -> str:
        if self.num_tokens <= self.min_tokens or not delta:
            return delta
        text, matched = self.stops.feed(delta)
        if matched:
            self.finish_reason = "stop"
        return text

    def add(self, token_ids: list[int], samples: list[SampleResult]) -> Piece:
        """New tokens. If a stop string matched, the returned piece is the choice's last."""
        piece = Piece()
        for i, tok in enumerate(token_ids):
            if self.finish_reason is not None:
                break  # tokens the engine produced past a stop string
            self.num_tokens += 1
            if self.want_ids:
                piece.token_ids.append(tok)
            if self.want_logprobs and i < len(samples):
                piece.samples.append((samples[i], len(self.text) + len(piece.text)))
            if tok in self.stop_ids and self.num_tokens > self.min_tokens and not self.include_stop:
                continue  # the engine's stop token: it ends the output and shows no text
            piece.text += self._visible(self.detok.add([tok]))
        if self.finish_reason is not None:
            return self._close(piece, self.finish_reason)
        return self._record(piece, final=False)

    def finish(self, reason: str) -> Piece:
        """The engine ended the request ("stop", "length" or "abort")."""
        piece = Piece(text=self._visible(self.detok.flush()))
        if self.finish_reason is None:
            piece.text += self.stops.flush()
        return self._close(piece, self.finish_reason or reason)

    def _close(self, piece: Piece, reason: str) -> Piece:
        self._record(piece, final=True)
        # a call cut by max_tokens stays "length": its arguments are incomplete
        calls = self.parsed.tool_calls and self.calls_finish and reason == "stop"
        self.finish_reason = piece.finish_reason = "tool_calls" if calls else reason
        return piece

    def _record(self, piece: Piece, final: bool) -> Piece:
        if self.parser is not None:
            piece.parsed = self.parser.feed(piece.text)
            if final:
                piece.parsed.extend(self.parser.finish())
            self.parsed.extend(piece.parsed)
        self.text += piece.text
        self.samples += piece.samples
        self.token_ids += piece.token_ids
        return piece
