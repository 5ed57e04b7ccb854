"""POST /v1/chat/completions: chat template -> engine -> reasoning / content / tool calls.

Streaming as OpenAI streams: `role` rides on each choice's first delta (sent with the first
real output, so a client's TTFT is not a fake early chunk); a tool call's first delta carries
index, id, type and name, later ones index and the next `arguments` text (never null); the
choice ends with finish_reason "tool_calls" when calls were produced ("stop" for a call forced by name, as OpenAI
does). With tool_choice "none" the
template does not see the tools and the output is plain content. With "required" or a named function the
prompt ends with the line's tool-call opener (ChatFormat.forced_tool_call), which the output parser reads
ahead of the output: the call's first delta (with the name, when named) comes with the first tokens.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from openinfer.text.parsers import ToolCallDelta, collect_tool_calls
from openinfer.sampling.sampler import SamplingParams
from openinfer.sampling.structured import OutputGrammar, reasoning_gate
from openinfer.text.tokenizer import ChatTemplateError

from .auth import Caller
from .errors import bad_request
from .generate import Plan, check_prompt_length, max_tokens_for, respond
from .host import ModelHost, ServedModel
from .output import ChoiceOutput, Piece, finite, token_namer, vllm_prompt_logprobs
from .protocol import ChatRequest, parse_chat
from .submission import Choice


def _tool_delta(d: ToolCallDelta) -> dict[str, Any]:
    out: dict[str, Any] = {"index": d.index}
    if d.id is not None:
        out.update(id=d.id, type="function")
        out["function"] = {"name": d.name, "arguments": d.arguments}
    else:
        out["function"] = {"arguments": d.arguments}
    return out


@dataclass
class ChatPrompt:
    """A chat request's rendered prompt and its choices' plan, ready for generate.submit."""
    text: str      # up to a forced call's opener
    opener: str    # a forced call's opener, which ends the prompt the engine sees
    ids: list[int]
    plan: Plan


class ChatOutputs:
    """How a chat prompt's output is read: reasoning split off, then tool calls (generate.Outputs)."""

    def __init__(self, model: ServedModel, req: ChatRequest, prompt: ChatPrompt, prefix: str = "chatcmpl") -> None:
        self.engine = model.engine
        self.req = req
        self.prefix = prefix
        self.prompt_text = prompt.text
        self.opener = prompt.opener
        # a structured output constrains the answer: where reasoning may come first, from its end marker on
        self.reasoning_gate = reasoning_gate(self.engine.chat_format, prompt.text, self.engine.tokenizer) \
            if req.gen.grammar is not None else None

    def output(self, params: SamplingParams) -> ChoiceOutput:
        parser = self.engine.chat_format.stream_parser(self.prompt_text, self.req.tools, self.opener,
                                                       None if self.req.parallel_tool_calls else 1)
        return ChoiceOutput(self.engine.tokenizer, self.engine.eos_token_ids, self.req.gen, params, parser,
                            calls_finish=self.req.tool_name is None)


class ChatCompletionFormat(ChatOutputs):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, model: ServedModel, req: ChatRequest, prompt: ChatPrompt) -> None:
        super().__init__(model, req, prompt)
        self.prompt_ids = prompt.ids
        self._ids_sent = False           # return_token_ids: the prompt's ids went out with the first chunk
        self._role_sent: set[int] = set()

    def _logprobs(self, samples: list) -> dict[str, Any] | None:
        if self.req.gen.logprobs is None:
            return None
        tok = self.engine.tokenizer
        name = token_namer(tok, self.req.gen)

        def entry(token: int, logprob: float) -> dict[str, Any]:
            return {"token": name(token), "logprob": finite(logprob), "bytes": tok.token_bytes(token)}

        return {"content": [{**entry(s.token, s.logprob), "top_logprobs": [entry(t, lp) for t, lp in s.top or []]}
                            for s, _ in samples]}

    def chunk_choice(self, c: Choice, piece: Piece) -> dict[str, Any] | None:
        d = piece.parsed
        delta: dict[str, Any] = {}
        if d.reasoning:
            delta["reasoning_content"] = d.reasoning
        if d.content:
            delta["content"] = d.content
        if d.tool_calls:
            delta["tool_calls"] = [_tool_delta(t) for t in d.tool_calls]
        if not delta and not piece.samples and not piece.token_ids and piece.finish_reason is None:
            return None  # the parser held the text back (a partial tag)
        if c.index not in self._role_sent:
            self._role_sent.add(c.index)
            delta = {"role": "assistant", **delta}
        choice = {"index": c.index, "delta": delta, "logprobs": self._logprobs(piece.samples),
                  "finish_reason": piece.finish_reason}
        if self.req.gen.return_token_ids:
            choice["token_ids"] = piece.token_ids
        return choice

    def final_choice(self, c: Choice) -> dict[str, Any]:
        out = c.out.parsed
        calls = collect_tool_calls(out.tool_calls)
        message: dict[str, Any] = {"role": "assistant", "content": out.content or (None if calls else ""),
                                   "reasoning_content": out.reasoning or None}
        if calls:
            message["tool_calls"] = [{"id": t.id, "type": "function",
                                      "function": {"name": t.name, "arguments": t.arguments}} for t in calls]
        choice = {"index": c.index, "message": message, "logprobs": self._logprobs(c.out.samples),
                  "finish_reason": c.out.finish_reason}
        if self.req.gen.return_token_ids:
            choice["token_ids"] = c.out.token_ids
        return choice

    def chunk_fields(self) -> dict[str, Any]:
        """return_token_ids: the prompt's ids at the top of the stream's first chunk."""
        if not self.req.gen.return_token_ids or self._ids_sent:
            return {}
        self._ids_sent = True
        return {"prompt_token_ids": self.prompt_ids}

    def response_fields(self, choices: list[Choice]) -> dict[str, Any]:
        """vLLM's prompt_logprobs and prompt_token_ids, once per response: every choice ran the same prompt."""
        out: dict[str, Any] = {}
        if (k := self.req.gen.prompt_logprobs) is not None:
            out["prompt_logprobs"] = vllm_prompt_logprobs(self.engine.tokenizer, choices[0].out.prompt_samples or [], k)
        if self.req.gen.return_token_ids:
            out["prompt_token_ids"] = self.prompt_ids
        return out


def _render(model: ServedModel, req: ChatRequest, prompt_param: str) -> tuple[str, str, list[int]]:
    """(the rendered prompt, a forced call's opener appended to it, the prompt's token ids)."""
    tokenizer, fmt = model.engine.tokenizer, model.engine.chat_format
    if req.reasoning_effort not in (None, "none") and fmt.reasoning_parser is None:
        raise bad_request(f"'{req.reasoning_effort_param}' is not supported by model '{req.gen.model}': it does not "
                          "reason. Leave it out (or send \"none\").", req.reasoning_effort_param,
                          "unsupported_parameter")
    try:
        messages = fmt.template_messages(req.messages)
        text = tokenizer.apply_chat_template(messages, tools=req.tools, add_generation_prompt=req.add_generation_prompt,
                                             continue_final_message=req.continue_final_message, **req.template_kwargs)
    except ChatTemplateError as e:
        raise bad_request(f"The chat template rejected the messages: {e}", prompt_param) from None
    opener = ""
    if req.tool_required:
        forced = fmt.forced_tool_call(text, req.tool_name)
        if forced is None:
            raise bad_request(f"Model '{req.gen.model}' cannot be made to call a tool (its line declares no tool-call "
                              "format); use tool_choice \"auto\".", "tool_choice", "unsupported_parameter")
        text += forced[0]
        opener = forced[1]
    elif req.tools and fmt.tool_parser is None:
        raise bad_request(f"Model '{req.gen.model}' has no tool-call format (its line declares none), so it cannot "
                          "use 'tools'; send none, or tool_choice \"none\".", "tools", "unsupported_parameter")
    check_prompt_length(model, text + opener, req.gen, prompt_param)
    ids = req.gen.truncated(tokenizer.encode(text + opener, add_special_tokens=req.add_special_tokens),
                            model.engine.max_model_len)
    if not ids:
        raise bad_request("The chat template rendered an empty prompt.", prompt_param)
    return text, opener, ids


async def chat_prompt(model: ServedModel, req: ChatRequest, prompt_param: str = "messages") -> ChatPrompt:
    """The prompt of `req` (messages; `prompt_param` names them in errors) and the SamplingParams of its choices;
    a forced call's arguments held to their schemas where the line gives a grammar."""
    text, opener, ids = await asyncio.to_thread(_render, model, req, prompt_param)  # off the event loop
    if req.tool_required:   # the output is the call: a JSON format given too applies to text answers, not to it
        grammar = model.engine.chat_format.tool_call_grammar(req.tools, req.tool_name, req.parallel_tool_calls)
        req.gen.grammar = OutputGrammar("grammar", grammar, "tools") if grammar else None   # the arguments' schemas
    max_tokens = max_tokens_for(model, len(ids), req.gen, None, prompt_param)
    engine = model.engine
    plan = [(0, ids, req.gen.params(j, max_tokens, engine.tokenizer, engine.vocab_size, engine.sampling_defaults))
            for j in range(req.gen.n)]
    return ChatPrompt(text, opener, ids, plan)


async def create_chat_completion(host: ModelHost, body: dict[str, Any], caller: Caller) -> Response:
    arrival = time.perf_counter()
    req = parse_chat(body)
    req.gen.cache_salt = caller.cache_salt(req.gen.cache_salt)
    model = host.get(req.gen.model)
    model.check_sequences(1, req.gen.n)
    prompt = await chat_prompt(model, req)
    return await respond(model, req.gen, ChatCompletionFormat(model, req, prompt), arrival, prompt.plan,
                         [len(prompt.ids)])
