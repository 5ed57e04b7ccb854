"""The request path both generation endpoints share, after their own parsing and prompt building:
length check -> submit every choice -> wait until the engine took them -> stream or collect.

An endpoint supplies a Format (how a choice becomes JSON); this module owns the order of
things and the abort-on-every-exit rule (the SSE response takes over `close` once returned).
submit() is the part before the output, which /v1/responses (its own output shape) shares.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Protocol

from starlette.responses import JSONResponse, Response

from openinfer.sampling.sampler import SamplingParams
from openinfer.sampling.structured import Constraint, GrammarError, ReasoningGate, compile_grammar

from .errors import bad_request
from .host import ServedModel
from .output import ChoiceOutput, Piece
from .protocol import Generation
from .sse import DONE, ChunkEvents, SSEResponse, error_event
from .submission import Choice, Submission


class Outputs(Protocol):
    """How an endpoint reads its choices' output: what submit() needs."""
    prefix: str          # response id prefix
    reasoning_gate: ReasoningGate | None   # where a structured output's grammar starts (None: at once)

    def output(self, params: SamplingParams) -> ChoiceOutput: ...


class Format(Outputs, Protocol):
    object: str          # response object type
    chunk_object: str    # stream chunk object type

    def chunk_choice(self, c: Choice, piece: Piece) -> dict[str, Any] | None: ...
    def final_choice(self, c: Choice) -> dict[str, Any]: ...
    def response_fields(self, choices: list[Choice]) -> dict[str, Any]: ...   # top-level, non-streamed
    def chunk_fields(self) -> dict[str, Any]: ...   # top-level, each streamed chunk


def check_prompt_length(model: ServedModel, text: str, gen: Generation, prompt_param: str) -> None:
    """Refuse a prompt text that cannot fit the context before tokenizing it (the tokenizer's longest token bounds
    the characters a token covers), so an oversized prompt costs a length check, not seconds of tokenizing. A
    prompt that truncate_prompt_tokens cuts may be any length."""
    limit = model.engine.max_model_len
    if gen.truncate_prompt_tokens is None and (least := model.engine.tokenizer.min_tokens(text)) >= limit:
        raise bad_request(f"This model's maximum context length is {limit} tokens. However, your {prompt_param} "
                          f"has at least {least} tokens ({len(text)} characters), which leaves no room for the "
                          f"completion. Please reduce the length of the {prompt_param}.", prompt_param,
                          "context_length_exceeded")


def max_tokens_for(model: ServedModel, prompt_len: int, gen: Generation, default: int | None,
                   prompt_param: str) -> int:
    """The request's max_tokens, else `default` (None: fill the context) clamped to what fits;
    400 with the numbers when the prompt plus max_tokens exceed the context."""
    limit = model.engine.max_model_len
    if prompt_len >= limit:
        raise bad_request(f"This model's maximum context length is {limit} tokens. However, your {prompt_param} "
                          f"has {prompt_len} tokens, which leaves no room for the completion. Please reduce the "
                          f"length of the {prompt_param}.", prompt_param, "context_length_exceeded")
    if gen.max_tokens is None:
        return min(default or limit, limit - prompt_len)
    if gen.max_tokens >= 1 and prompt_len + gen.max_tokens > limit:
        raise bad_request(f"This model's maximum context length is {limit} tokens. However, you requested "
                          f"{prompt_len + gen.max_tokens} tokens ({prompt_len} in the {prompt_param}, "
                          f"{gen.max_tokens} for the completion). Please reduce the length of the {prompt_param} "
                          f"or '{gen.max_tokens_param}'.", gen.max_tokens_param, "context_length_exceeded")
    return gen.max_tokens


async def constraints(model: ServedModel, gen: Generation, count: int,
                      gate: ReasoningGate | None) -> list[Constraint | None]:
    """One grammar per choice when the request constrains the output. Compiled in a worker thread (a
    complex schema takes up to ~1 s, bounded by llguidance's limits) before anything is submitted,
    so a grammar llguidance rejects is a 400, never an engine error."""
    spec = gen.grammar
    if spec is None:
        return [None] * count
    if gen.sampling.get("allowed_token_ids") is not None:   # two masks whose overlap may be empty
        raise bad_request(f"'allowed_token_ids' cannot be combined with '{spec.param}': send one of them.",
                          "allowed_token_ids")
    try:
        return await asyncio.to_thread(compile_grammar, model.engine, spec, count, gate)
    except GrammarError as e:
        reason = str(e).replace("<non-verbose/>", "").strip()[:500]   # (llguidance's marker of a short message)
        raise bad_request(f"The {spec.kind} of '{spec.param}' cannot be enforced: {reason}", spec.param) from None


Plan = list[tuple[int, list[int], SamplingParams]]   # (prompt index, prompt ids, params) per choice


async def submit(model: ServedModel, gen: Generation, outputs: Outputs, arrival: float, plan: Plan,
                 wait: bool = True) -> Submission:
    """Every choice of `plan` (all validated before anything runs) submitted and (with `wait`) taken by the engine;
    on any error the requests already submitted are aborted."""
    model.admit()
    grammars = await constraints(model, gen, len(plan), outputs.reasoning_gate)
    sub = Submission(model.engine, model.metrics, arrival, outputs.prefix, gen.max_tokens_param, model.live)
    try:
        for (prompt_index, ids, params), grammar in zip(plan, grammars):
            sub.add(prompt_index, ids, params, outputs.output(params), gen.cache_salt, grammar, gen.priority)
        await sub.started(wait)
    except BaseException:
        sub.close()
        raise
    return sub


async def respond(model: ServedModel, gen: Generation, fmt: Format, arrival: float, plan: Plan,
                  prompt_lens: list[int]) -> Response:
    sub = await submit(model, gen, fmt, arrival, plan)
    head = {"id": sub.id, "object": fmt.chunk_object, "created": int(time.time()), "model": model.name}
    streaming = False
    try:
        if gen.stream:
            streaming = True
            return SSEResponse(_chunks(sub, gen, fmt, head, prompt_lens), sub.id, error_event, sub.close, DONE)
        async for _ in sub.pieces():
            pass  # each ChoiceOutput accumulates its whole output
        return JSONResponse({**head, "object": fmt.object, "choices": [fmt.final_choice(c) for c in sub.choices],
                             "usage": sub.usage(prompt_lens), **fmt.response_fields(sub.choices)})
    finally:
        if not streaming:
            sub.close()


async def _chunks(sub: Submission, gen: Generation, fmt: Format, head: dict[str, Any],
                  prompt_lens: list[int]) -> AsyncIterator[str]:
    chunks = ChunkEvents(head)
    async for c, piece in sub.pieces():
        if (choice := fmt.chunk_choice(c, piece)) is not None:
            usage = sub.usage(prompt_lens) if gen.continuous_usage else None
            yield chunks.event(choice, usage, fmt.chunk_fields())
    if gen.include_usage:
        yield chunks.event(None, sub.usage(prompt_lens), {})
