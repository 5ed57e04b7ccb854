"""POST /v1/completions: a string, a list of strings, token ids or a list of token-id lists.

Prompt i's choice j is response choice i*n + j (as vLLM numbers them); with `seed`, choice j of
every prompt uses seed + j, so a batch answers like the same prompts sent one by one.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from starlette.responses import Response

from openinfer.sampling.sampler import SampleResult, SamplingParams

from .auth import Caller
from .errors import bad_request
from .generate import check_prompt_length, max_tokens_for, respond
from .host import ModelHost, ServedModel
from .output import ChoiceOutput, Piece, finite, token_namer, vllm_prompt_logprobs
from .protocol import CompletionRequest, parse_completion
from .submission import Choice

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint


class CompletionFormat:
    prefix = "cmpl"
    object = chunk_object = "text_completion"
    reasoning_gate = None   # no chat format: a structured output is constrained from its first token

    def __init__(self, model: ServedModel, req: CompletionRequest, prompts: list[list[int]], truncated: set[int]
                 ) -> None:
        self.engine = model.engine
        self.tokenizer = model.engine.tokenizer
        self.req = req
        self.prompts = prompts
        self.truncated = truncated       # the prompts cut by truncate_prompt_tokens
        self._started: set[int] = set()   # streamed choices whose first chunk went out

    def output(self, params: SamplingParams) -> ChoiceOutput:
        return ChoiceOutput(self.tokenizer, self.engine.eos_token_ids, self.req.gen, params)

    def _echo_text(self, c: Choice) -> str:
        """The prompt as echoed: the client's string, or the token ids it ran on decoded (given or truncated)."""
        prompt, ids = self.req.prompts[c.prompt_index], self.prompts[c.prompt_index]
        if isinstance(prompt, str) and c.prompt_index not in self.truncated:
            return prompt
        return self.tokenizer.decode(ids)

    def _prompt_entries(self, c: Choice) -> list[tuple[int, SampleResult | None, int]]:
        """(token, its logprobs, text offset) of each prompt token: the first has none; offsets add up the
        tokens' texts (vLLM's text_offset)."""
        ids, samples = self.prompts[c.prompt_index], c.out.prompt_samples or []
        offsets = itertools.accumulate((len(self.tokenizer.token_text(t)) for t in ids[:-1]), initial=0)
        return list(zip(ids, [None, *samples], offsets))

    def _logprobs(self, entries: list[tuple[int, SampleResult | None, int]]) -> dict[str, Any] | None:
        if self.req.gen.logprobs is None:
            return None
        text, k = token_namer(self.tokenizer, self.req.gen), self.req.gen.logprobs
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, s, offset in entries:
            out["tokens"].append(text(token))
            out["text_offset"].append(offset)
            if s is None:   # the first prompt token: nothing before it to score it
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(finite(s.logprob))
            # the token plus the top-k alternatives (so up to k+1 entries, as OpenAI documents)
            top = {text(s.token): finite(s.logprob)}
            top.update((text(t), finite(lp)) for t, lp in (s.top or [])[:k])
            out["top_logprobs"].append(top)
        return out

    def _choice(self, c: Choice, text: str, samples: list[tuple[SampleResult, int]], token_ids: list[int],
                first: bool, finish_reason: str | None) -> dict[str, Any]:
        """A choice's JSON: `first` marks its first chunk, or the whole choice, where the prompt goes."""
        entries = [(s.token, s, offset) for s, offset in samples] if samples else []
        if first and self.req.echo:
            prompt = self._echo_text(c)
            head = self._prompt_entries(c) if self.req.gen.logprobs is not None else []
            text, entries = prompt + text, head + [(t, s, len(prompt) + o) for t, s, o in entries]
        choice = {"index": c.index, "text": text, "logprobs": self._logprobs(entries), "finish_reason": finish_reason}
        gen = self.req.gen
        if gen.prompt_logprobs is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(self.tokenizer, c.out.prompt_samples or [],
                                                             gen.prompt_logprobs)
        if gen.return_token_ids:
            choice["token_ids"] = token_ids
            if first:
                choice["prompt_token_ids"] = self.prompts[c.prompt_index]
        return choice

    def chunk_choice(self, c: Choice, piece: Piece) -> dict[str, Any] | None:
        first = c.index not in self._started   # the prompt comes with a choice's first chunk
        self._started.add(c.index)
        return self._choice(c, piece.text, piece.samples, piece.token_ids, first, piece.finish_reason)

    def final_choice(self, c: Choice) -> dict[str, Any]:
        return self._choice(c, c.out.text, c.out.samples, c.out.token_ids, True, c.out.finish_reason)

    def chunk_fields(self) -> dict[str, Any]:
        return {}

    def response_fields(self, choices: list[Choice]) -> dict[str, Any]:
        return {}


def _encode(model: ServedModel, req: CompletionRequest) -> tuple[list[list[int]], set[int]]:
    """Each prompt's token ids (truncated as asked), and which prompts truncate_prompt_tokens cut."""
    out, cut = [], set()
    for i, prompt in enumerate(req.prompts):
        param = "prompt" if len(req.prompts) == 1 else f"prompt[{i}]"
        if isinstance(prompt, str):
            check_prompt_length(model, prompt, req.gen, param)
        ids = model.engine.tokenizer.encode(prompt, req.add_special_tokens) if isinstance(prompt, str) else prompt
        kept = req.gen.truncated(ids, model.engine.max_model_len)
        if len(kept) < len(ids):
            ids = kept
            cut.add(i)
        if not ids:
            raise bad_request(f"'{param}' is empty.", param)
        if bad := [t for t in ids if not 0 <= t < model.engine.vocab_size]:
            raise bad_request(f"'{param}' has token id {bad[0]} outside the vocabulary "
                              f"(0..{model.engine.vocab_size - 1}).", param)
        out.append(ids)
    return out, cut


async def create_completion(host: ModelHost, body: dict[str, Any], caller: Caller) -> Response:
    arrival = time.perf_counter()
    req = parse_completion(body)
    req.gen.cache_salt = caller.cache_salt(req.gen.cache_salt)
    model = host.get(req.gen.model)
    model.check_sequences(len(req.prompts), req.gen.n)
    prompts, cut = await asyncio.to_thread(_encode, model, req)  # big prompts must not stall the event loop
    plan = []
    for i, ids in enumerate(prompts):
        max_tokens = max_tokens_for(model, len(ids), req.gen, DEFAULT_MAX_TOKENS, "prompt")
        plan += [(i, ids, req.gen.params(j, max_tokens, model.engine.tokenizer, model.engine.vocab_size,
                                         model.engine.sampling_defaults))
                 for j in range(req.gen.n)]
    return await respond(model, req.gen, CompletionFormat(model, req, prompts, cut), arrival, plan,
                         [len(p) for p in prompts])
