"""A streamed chunk's text, written from its head serialized once (ChunkEvents), is the text of the whole payload
through the JSON encoder, byte for byte: fuzzed texts with escapes, control characters, non-ASCII, surrogates."""
from __future__ import annotations

import json
import random

from openinfer.server.sse import ChunkEvents, event, to_json

ALPHABET = ["a", " ", '"', "\\", "/", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f", "é", "ß", "\u2028",
            "\u2029", "😀", "\ud800", "<", "\ufffd", "中"]
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}}


def fuzzed_text(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12)))


def test_chunk_events_equal_the_encoded_payload() -> None:
    rng = random.Random(0)
    for _ in range(500):
        text = fuzzed_text(rng)
        head = {"id": f"chatcmpl-{text}", "object": "chat.completion.chunk", "created": rng.randint(0, 2**40),
                "model": fuzzed_text(rng)}
        logprobs = rng.choice([None, {"content": [{"token": text, "logprob": -0.25, "bytes": list(text.encode(
            "utf-8", "surrogatepass")), "top_logprobs": [{"token": text, "logprob": float("-inf"), "bytes": None}]}]}])
        delta = rng.choice([{}, {"content": text}, {"role": "assistant", "reasoning_content": text},
                            {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}])
        choice = {"index": rng.randint(0, 3), "delta": delta, "logprobs": logprobs,
                  "finish_reason": rng.choice([None, "stop", "length", "tool_calls"])}
        if rng.random() < 0.3:
            choice["token_ids"] = [rng.randint(0, 9) for _ in range(rng.randint(0, 3))]
        usage = rng.choice([None, USAGE])
        fields = rng.choice([{}, {"prompt_token_ids": [1, 2, 3]}])
        chunks = ChunkEvents(head)
        assert chunks.event(choice, usage, fields) == event({**head, "choices": [choice], "usage": usage, **fields})
        assert chunks.event(None, USAGE, {}) == event({**head, "choices": [], "usage": USAGE})


def test_to_json_matches_the_encoder_on_scalars_and_nesting() -> None:
    rng = random.Random(1)
    values = [None, True, False, 0, -7, 2**70, 1.5, float("nan"), "", [1, "x", None], {"a": {"b": [None, 2.5]}}]
    values += [fuzzed_text(rng) for _ in range(200)]
    for v in values:
        assert to_json(v) == json.dumps(v, ensure_ascii=False, separators=(",", ":"))
