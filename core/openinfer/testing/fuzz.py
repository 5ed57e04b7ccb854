"""Seeded fuzzing of a running server's five request endpoints, as an attacker and a careless client would.

`cases(seed, count, model)` builds request bodies: a valid body per endpoint, then one to three mutations (a
known field set to a valid but unusual value, which takes the request through the engine, or to a hostile value —
lone UTF-16 surrogates, huge or negative numbers, NaN, deep nesting, schemas, grammars and regexes that compile but
cannot run — a field dropped, an unknown field, a hostile key), or a body
that is not a JSON object at all. The work each asks is bounded: the token limits stay small or impossible.
`fuzz(...)` sends them over one keep-alive connection and tallies the answers: a fault is a 5xx, an error event
after a 200, a refused request that closed the connection, or no answer. Used by the CI's short pass
(tests/server/test_fuzz.py) and the release soak (scripts/soak.py); loopback only.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import httpx

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/tokenize", "/detokenize")
TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
SURROGATE = "\ud800"   # json.dumps writes it as the escape \ud800, which json.loads turns back into a lone surrogate

_STRINGS = ["", "a", SURROGATE, "x" + SURROGATE + "y", "\udfff", "你好 🙂", "\x00\x1f", "<|im_start|>", "{{ 7*7 }}",
            "{% for x in range(10**9) %}{% endfor %}", "x" * 5000, "-1", "null", "\\", "</think>", "\n" * 50]
_NUMBERS = [-1, 0, 1, 2, 0.5, -0.0, 1e308, -1e308, 2**31, 2**63, -2**63 - 1, 10**40, float("nan"), float("inf"),
            -2**63, 2**64 - 1]
_SCHEMAS = [{"$ref": "#"}, {"type": "object", "properties": {SURROGATE: {"type": "string"}}},
            {"type": "string", "pattern": "a{1000000}"}, {"type": "array", "minItems": 10**9},
            {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]},
            {"type": "nonsense"}, {"anyOf": []}, {"type": "integer", "minimum": 5, "maximum": 1}, {}]
_GRAMMARS = ['start: start "a"', 'start: start "a" | "b"', "root ::= root", "root ::= root \"a\" | \"b\"",
             "start: /a{1000000}/", "%%%", "start: " + "(" * 500 + '"a"' + ")" * 500]
_REGEXES = ["a{1000000}", "(a+)+$", "[", "(?<=a)b", "a{5,2}", "\\p{Nope}", "(" * 300 + "a" + ")" * 300]


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _value(rng: random.Random, depth: int = 0) -> Any:
    """A hostile JSON value of any shape."""
    kind = rng.randrange(10 if depth < 2 else 6)
    if kind == 0:
        return rng.choice(_STRINGS)
    if kind == 1:
        return rng.choice(_NUMBERS)
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return rng.choice([[], {}, [1, 2, 3], [-1], [10**12], ["a", SURROGATE], [[1], [2]]])
    if kind == 4:
        return _nested(rng.choice([10, 70, 300]))   # (deeper: _raw_body, json.dumps cannot)
    if kind == 5:
        return rng.randrange(-3, 40)
    if kind == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        keys = _STRINGS + ["type", "role", "text"]
        return {rng.choice(keys): _value(rng, depth + 1) for _ in range(rng.randrange(3))}
    if kind == 8:
        return rng.choice(_SCHEMAS)
    return rng.choice(_GRAMMARS + _REGEXES)


def _special(rng: random.Random, key: str) -> Any:
    """A value aimed at `key`'s own parsing (valid in form, hostile in content), or None for a generic one."""
    table: dict[str, list[Any]] = {
        "response_format": [{"type": "json_schema", "json_schema": {"name": "x", "schema": rng.choice(_SCHEMAS)}},
                            {"type": "json_object"}, {"type": "json_schema"}, {"type": "text", "extra": 1}],
        "structured_outputs": [{"json": rng.choice(_SCHEMAS)}, {"regex": rng.choice(_REGEXES)},
                               {"grammar": rng.choice(_GRAMMARS)}, {"choice": rng.choice([[], [""], ["a", "b"]])},
                               {"json": "{bad"}, {"json_object": True}, {"regex": "a", "choice": ["a"]}],
        "text": [{"format": {"type": "json_schema", "name": "x", "schema": rng.choice(_SCHEMAS)}},
                 {"format": {"type": "json_object"}}],
        "tools": [[{"type": "function", "function": {"name": "f", "parameters": rng.choice(_SCHEMAS)}}],
                  [{"type": "function", "name": "f", "parameters": rng.choice(_SCHEMAS)}],
                  [{"type": "function", "function": {"name": SURROGATE}}], [{"type": "web_search"}]],
        "tool_choice": ["required", "none", "auto", {"type": "function", "function": {"name": "f"}},
                        {"type": "function", "name": "f"}],
        "messages": [[{"role": "user", "content": [{"type": "text", "text": rng.choice(_STRINGS)}]}],
                     [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                            "function": {"name": "f",
                                                                                         "arguments": "{"}}]}],
                     [{"role": rng.choice(["tool", "developer", "system", "nobody"]), "content": "x"}]],
        "prompt": [[[1, 2], [3]], [-1], [10**9], ["a"] * rng.choice([2, 100, 5000]), [[]], [1.5], [True]],
        "input": [[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": SURROGATE}]}],
                  [{"type": "function_call_output", "call_id": "c", "output": "x"}], [{"type": "reasoning"}]],
        "metadata": [{"k": "v" * 10**5}, {str(i): "v" for i in range(100)}, {SURROGATE: "v"}, {"k": 1}],
        "stream_options": [{"include_usage": True}, {"continuous_usage_stats": True}, {"nope": 1}],
        "chat_template_kwargs": [{"enable_thinking": False}, {"messages": []}, {"x" * 100: _nested(50)}],
        "logit_bias": [{"1": 100}, {"-5": 1}, {"abc": 1}, {str(10**9): 1}],
        "n": [2, 64, 65, 129, 10**6],
    }
    options = table.get(key)
    return rng.choice(options) if options and rng.random() < 0.6 else None


# values the server must serve (200): they take a request through the engine's less common paths
VALID: dict[str, list[Any]] = {
    "temperature": [0, 0.7, 2.0], "top_p": [0.1, 1.0], "top_k": [1, 5, -1], "min_p": [0.0, 0.5],
    "presence_penalty": [-2, 2], "frequency_penalty": [1.5], "repetition_penalty": [0.5, 1.3], "min_tokens": [0, 3],
    "ignore_eos": [True], "stop_token_ids": [[0, 1]], "allowed_token_ids": [[9707, 11, 13]], "seed": [-1, 0, 2**62],
    "logit_bias": [{"11": 50, "13": -100}], "cache_salt": ["s", "你好"], "stop": [" ", ["a", "e"], "\n"],
    "bad_words": [["the", " and"]], "include_stop_str_in_output": [True], "skip_special_tokens": [False],
    "return_tokens_as_token_ids": [True], "return_token_ids": [True], "truncate_prompt_tokens": [1, -1, 3],
    "n": [2, 3], "logprobs": [0, 5], "echo": [True], "prompt_logprobs": [0, 2],
    "stream_options": [{"include_usage": True, "continuous_usage_stats": True}],
    "response_format": [{"type": "json_object"}, {"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}],
    "structured_outputs": [{"regex": "[a-c]{2,5}"}, {"choice": ["yes", "no"]}, {"grammar": 'start: "a"+'},
                           {"grammar": 'root ::= "x" | "y"'}],
    "chat_template_kwargs": [{"enable_thinking": False}], "add_special_tokens": [True],
    "instructions": ["Be brief."], "metadata": [{"k": "v"}], "store": [False], "user": ["u"],
    "text": [{"format": {"type": "json_object"}}], "reasoning": [{"effort": "none"}],
}

_GENERATION = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
               "min_tokens", "ignore_eos", "stop_token_ids", "allowed_token_ids", "seed", "logit_bias", "cache_salt",
               "stop", "bad_words", "include_stop_str_in_output", "skip_special_tokens", "return_tokens_as_token_ids",
               "return_token_ids", "truncate_prompt_tokens", "n", "prompt_logprobs", "stream_options",
               "response_format", "structured_outputs")
SERVABLE = {   # the VALID fields each endpoint takes
    "/v1/completions": (*_GENERATION, "logprobs", "echo", "add_special_tokens"),
    "/v1/chat/completions": (*_GENERATION, "chat_template_kwargs", "add_special_tokens"),
    "/v1/responses": ("temperature", "top_p", "instructions", "metadata", "store", "user", "text", "reasoning",
                      "chat_template_kwargs"),
    "/tokenize": ("add_special_tokens",), "/detokenize": (),
}

FIELDS = sorted({
    "model", "prompt", "messages", "input", "tokens", "n", "stream", "stream_options", "temperature", "top_p", "top_k",
    "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos",
    "stop_token_ids", "allowed_token_ids", "logit_bias", "seed", "cache_salt", "stop", "bad_words",
    "include_stop_str_in_output", "skip_special_tokens", "return_tokens_as_token_ids", "return_token_ids",
    "truncate_prompt_tokens", "best_of", "use_beam_search", "length_penalty", "priority", "prompt_logprobs",
    "response_format", "structured_outputs", "logprobs", "top_logprobs", "echo", "suffix", "tools", "tool_choice",
    "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "add_special_tokens",
    "parallel_tool_calls", "modalities", "metadata", "user", "store", "instructions", "previous_response_id", "text",
    "reasoning", "background", "include", "truncation", "unknown_field", SURROGATE, *TOKEN_LIMITS})


def _base(endpoint: str, model: str, rng: random.Random) -> dict[str, Any]:
    stream = rng.random() < 0.3
    return {
        "/v1/completions": {"model": model, "prompt": "Hello", "max_tokens": 4, "stream": stream},
        "/v1/chat/completions": {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                 "stream": stream},
        "/v1/responses": {"model": model, "input": "Hi", "max_output_tokens": 4, "stream": stream},
        "/tokenize": {"model": model, "prompt": "Hello"},
        "/detokenize": {"model": model, "tokens": [9707, 11]},
    }[endpoint]


def _bounded(body: dict[str, Any]) -> None:
    """Keep the work small: a token limit stays tiny unless it is one the server must refuse outright."""
    for key in TOKEN_LIMITS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 8 < value < 2**31:
            body[key] = 8


def _raw_body(rng: random.Random, model: str) -> bytes:
    """A body that is not a well-formed JSON object."""
    return rng.choice([b"", b"{", b"[]", b"null", b"1", b'"x"', b"\xff\xfe{}", b'{"model": NaN}',
                       b'{"a":' + b"[" * 1000 + b"]" * 1000 + b"}", b'{"model": "' + model.encode() + b'"}}',
                       json.dumps({"model": model, "prompt": "Hello"}).encode()[:-3]])


@dataclass
class Case:
    endpoint: str
    body: bytes
    stream: bool


def cases(seed: int, count: int, model: str) -> Iterator[Case]:
    """`count` fuzzed requests, the same for the same seed."""
    rng = random.Random(seed)
    for _ in range(count):
        endpoint = rng.choice(ENDPOINTS)
        if rng.random() < 0.05:
            yield Case(endpoint, _raw_body(rng, model), False)
            continue
        body = _base(endpoint, model, rng)
        servable = rng.random() < 0.35 and SERVABLE[endpoint]   # only valid values of the endpoint's own fields
        for _ in range(rng.randint(1, 3)):
            op = rng.random()
            if servable:
                key = rng.choice(servable)
                body[key] = rng.choice(VALID[key])
            elif op < 0.2:
                key = rng.choice(list(VALID))
                body[key] = rng.choice(VALID[key])
            elif op < 0.7:
                key = rng.choice(FIELDS)
                special = _special(rng, key)
                body[key] = special if special is not None else _value(rng)
            elif op < 0.8 and len(body) > 1:
                del body[rng.choice([k for k in body if k not in TOKEN_LIMITS] or list(body))]
            elif op < 0.9:
                body[rng.choice(_STRINGS)] = _value(rng)
            else:   # a hostile value inside the base's own structure
                for key in ("messages", "input"):
                    if isinstance(body.get(key), list) and body[key] and isinstance(body[key][0], dict):
                        body[key][0][rng.choice(["content", "role", "name", SURROGATE, "tool_calls"])] = _value(rng)
        _bounded(body)
        stream = body.get("stream") is True
        yield Case(endpoint, json.dumps(body).encode(), stream)   # ensure_ascii: lone surrogates as \\u escapes


@dataclass
class Report:
    tried: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    faults: list[str] = field(default_factory=list)   # what went wrong, one line each

    def add_fault(self, case: Case, what: str) -> None:
        self.faults.append(f"{case.endpoint} {what}: {case.body[:300]!r}")


def _stream_error(text: str) -> str | None:
    """The first error event of an SSE body, if any."""
    for line in text.splitlines():
        if line.startswith("data: {") and ('"error":' in line[:20] or line.startswith('data: {"type":"error"')):
            return line[:300]
    return None


def send(client: httpx.Client, case: Case, report: Report) -> None:
    """One case: its status counted, and a fault recorded for a 5xx, an error event after a 200, a refused
    request that closed its connection (all but the over-size and over-time ones keep it), or no answer."""
    report.tried += 1
    try:
        r = client.post(case.endpoint, content=case.body, headers={"content-type": "application/json"})
    except httpx.HTTPError as e:
        report.statuses[0] += 1
        report.add_fault(case, f"no answer ({type(e).__name__}: {e})")
        return
    report.statuses[r.status_code] += 1
    if r.status_code >= 500:
        report.add_fault(case, f"{r.status_code} {r.text[:300]}")
    elif r.status_code == 200 and case.stream and (err := _stream_error(r.text)):
        report.add_fault(case, f"error event after 200: {err}")
    elif r.status_code >= 400 and r.headers.get("connection") == "close" and r.status_code not in (408, 413):
        report.add_fault(case, f"{r.status_code} closed the connection")
    elif r.status_code >= 400:
        try:
            error = r.json()["error"]
            assert isinstance(error["message"], str) and "type" in error
        except (ValueError, KeyError, TypeError, AssertionError):
            report.add_fault(case, f"{r.status_code} outside the OpenAI envelope: {r.text[:200]}")


def fuzz(base_url: str, model: str, seed: int, count: int, api_key: str | None = None,
         timeout: float = 60.0) -> Report:
    """Send `count` fuzzed requests (seeded) over one keep-alive connection; the tally."""
    report = Report()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=base_url, timeout=timeout, headers=headers) as client:
        for case in cases(seed, count, model):
            send(client, case, report)
    return report
