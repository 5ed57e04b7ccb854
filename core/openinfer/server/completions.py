"""POST /v1/completions: a string, a list of strings, token ids or a list of token-id lists.

Prompt i's choice j is response choice i*n + j (as vLLM numbers them); with `seed`, choice j of
every prompt uses seed + j, so a batch answers like the same prompts sent one by one.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.responses import Response

from openinfer.sampling import SamplingParams

from .errors import bad_request
from .generate import max_tokens_for, respond
from .host import ModelHost, ServedModel
from .output import ChoiceOutput, Piece, finite
from .protocol import CompletionRequest, parse_completion
from .submission import Choice

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint


class CompletionFormat:
    prefix = "cmpl"
    object = chunk_object = "text_completion"
    reasoning_gate = None   # no chat format: a structured output is constrained from its first token

    def __init__(self, model: ServedModel, req: CompletionRequest) -> None:
        self.engine = model.engine
        self.tokenizer = model.engine.tokenizer
        self.req = req

    def output(self, params: SamplingParams) -> ChoiceOutput:
        return ChoiceOutput(self.tokenizer, self.engine.eos_token_ids, self.req.gen, params)

    def _logprobs(self, samples: list) -> dict[str, Any] | None:
        if self.req.gen.logprobs is None:
            return None
        text = self.tokenizer.token_text
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for s, offset in samples:
            out["tokens"].append(text(s.token))
            out["token_logprobs"].append(finite(s.logprob))
            # the sampled token plus the top-k alternatives (so up to k+1 entries, as OpenAI documents)
            top = {text(s.token): finite(s.logprob)}
            top.update((text(t), finite(lp)) for t, lp in s.top or [])
            out["top_logprobs"].append(top)
            out["text_offset"].append(offset)
        return out

    def chunk_choice(self, c: Choice, piece: Piece) -> dict[str, Any] | None:
        return {"index": c.index, "text": piece.text, "logprobs": self._logprobs(piece.samples),
                "finish_reason": piece.finish_reason}

    def final_choice(self, c: Choice) -> dict[str, Any]:
        return {"index": c.index, "text": c.out.text, "logprobs": self._logprobs(c.out.samples),
                "finish_reason": c.out.finish_reason}


def _encode(model: ServedModel, req: CompletionRequest) -> list[list[int]]:
    out = []
    for i, prompt in enumerate(req.prompts):
        ids = model.engine.tokenizer.encode(prompt, req.add_special_tokens) if isinstance(prompt, str) else prompt
        param = "prompt" if len(req.prompts) == 1 else f"prompt[{i}]"
        if not ids:
            raise bad_request(f"'{param}' is empty.", param)
        if bad := [t for t in ids if not 0 <= t < model.engine.vocab_size]:
            raise bad_request(f"'{param}' has token id {bad[0]} outside the vocabulary "
                              f"(0..{model.engine.vocab_size - 1}).", param)
        out.append(ids)
    return out


async def create_completion(host: ModelHost, body: dict[str, Any]) -> Response:
    arrival = time.perf_counter()
    req = parse_completion(body)
    model = host.get(req.gen.model)
    prompts = await asyncio.to_thread(_encode, model, req)  # big prompts must not stall the event loop
    plan = []
    for i, ids in enumerate(prompts):
        max_tokens = max_tokens_for(model, len(ids), req.gen, DEFAULT_MAX_TOKENS, "prompt")
        plan += [(i, ids, req.gen.params(j, max_tokens, model.engine.vocab_size)) for j in range(req.gen.n)]
    return await respond(model, req.gen, CompletionFormat(model, req), arrival, plan, [len(p) for p in prompts])
