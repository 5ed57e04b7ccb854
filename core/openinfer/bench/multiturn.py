"""Runs multi-turn conversations (the agent workload): turn k+1's prompt is turn k's prompt + its output +
new user text, so every turn after the first should hit the prefix cache for everything but the new text."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncContextManager, Awaitable, Callable

import httpx

from openinfer.bench.client import CHAT, RequestOutput, send_request
from openinfer.bench.datasets import BenchRequest, Conversation, count_tokens

Tokenize = Callable[[str], Awaitable[list[int]]]


def make_tokenize(client: httpx.AsyncClient, model: str, tokenizer: Any) -> Tokenize:
    """Output text -> token ids for the next completions prompt: the local tokenizer, else the server's
    POST /tokenize (vLLM and openinfer both serve it). Re-tokenized text can differ from the generated ids
    at the seam; an agent re-sending text has exactly that behaviour too."""

    async def local(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    async def remote(text: str) -> list[int]:
        resp = await client.post("/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False})
        resp.raise_for_status()
        return list(resp.json()["tokens"])

    return local if tokenizer is not None else remote


def first_turn(conv: Conversation, chat: bool, estimate: Callable[[str], int]) -> BenchRequest:
    """The first request of a conversation on its own (used for ready checks and warm-ups)."""
    if chat:
        msgs = ([{"role": "system", "content": conv.system}] if conv.system else []) + [
            {"role": "user", "content": conv.user_turns[0]}]
        return BenchRequest(None, sum(estimate(m["content"]) for m in msgs), conv.output_len, messages=msgs)
    ids = list(conv.system) + list(conv.user_turns[0])
    return BenchRequest(ids, len(ids), conv.output_len)


async def run_conversation(
    client: httpx.AsyncClient,
    endpoint: str,
    model: str,
    conv: Conversation,
    sampling: dict[str, Any],
    tokenize: Tokenize,
    estimate: Callable[[str], int],
    request_id: str,
    limiter: AsyncContextManager[Any] | None = None,
    on_done: Callable[[], None] = lambda: None,
) -> list[RequestOutput]:
    """Sends the turns in order. A failed turn ends its conversation; the turns never sent are recorded as
    failed too, so `completed + failed` always equals conversations x turns."""
    chat = endpoint == CHAT
    messages: list[dict[str, Any]] = [{"role": "system", "content": conv.system}] if chat and conv.system else []
    ids: list[int] = [] if chat else list(conv.system)
    outputs: list[RequestOutput] = []
    for k, user in enumerate(conv.user_turns):
        if chat:
            messages.append({"role": "user", "content": user})
            req = BenchRequest(None, sum(estimate(m["content"]) for m in messages), conv.output_len,
                               messages=list(messages))
        else:
            ids = ids + list(user)
            req = BenchRequest(ids, len(ids), conv.output_len)
        async with limiter or contextlib.nullcontext():
            out = await send_request(client, endpoint, model, req, sampling, f"{request_id}-{k}")
        if chat and out.usage_prompt_tokens is not None:
            out.prompt_len = out.usage_prompt_tokens  # the template's tokens count too: trust the server
        outputs.append(out)
        on_done()
        failure = None if out.success else f"turn {k} of this conversation failed"
        if out.success and k + 1 < len(conv.user_turns):
            try:
                if chat:
                    messages.append({"role": "assistant", "content": out.generated_text})
                else:
                    ids = ids + await tokenize(out.generated_text)
            except (httpx.HTTPError, KeyError, ValueError) as e:
                failure = f"could not tokenize the output of turn {k}: {e}"
        if failure is not None:
            for _ in range(len(conv.user_turns) - k - 1):
                outputs.append(RequestOutput(error=f"not sent: {failure}"))
                on_done()
            break
    return outputs


def estimator(tokenizer: Any) -> Callable[[str], int]:
    """Prompt-length estimate before the server's usage arrives: exact with a tokenizer, else words."""
    if tokenizer is not None:
        return lambda text: count_tokens(tokenizer, text)
    return lambda text: len(text.split())
