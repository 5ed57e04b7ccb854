"""Bad input over raw HTTP: every mistake is a 400 (404 for a model) with the OpenAI envelope, naming
the field, and the server keeps serving."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from fake_engine import FakeEngine

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "fake", "prompt": "hi"}


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'"text"', b"", b"\xff\xfe"])
def test_malformed_or_non_object_body(http: httpx.Client, content: bytes) -> None:
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize", "/detokenize"):
        r = http.post(path, content=content, headers={"content-type": "application/json"})
        assert error_of(r, 400)["code"] == "invalid_json"


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {**CHAT, "model": 3}, "model"),
    ("/v1/chat/completions", {"messages": CHAT["messages"]}, "model"),
    ("/v1/chat/completions", {"model": "fake"}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": ["hi"]}, "messages[0]"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content[0]"),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "temperature": 3}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 1.5}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "n": 0}, "n"),
    ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"bogus": 1}}, "stream_options.bogus"),
    ("/v1/chat/completions", {**CHAT, "stop": [1, 2]}, "stop"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"x": 1}}, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"999999999": 1}}, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "stop_token_ids": ["a"]}, "stop_token_ids"),
    ("/v1/chat/completions", {**CHAT, "min_tokens": 100, "max_tokens": 10}, "min_tokens"),
    ("/v1/chat/completions", {**CHAT, "frobnicate": True}, "frobnicate"),
    ("/v1/chat/completions", {**CHAT, "response_format": "json"}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema"}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": [1]}}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "schema": {}}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "foo"}}}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "(("}}}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"properties": {"a": {"$ref": "#/nowhere"}}}}}}, "response_format"),
    ("/v1/completions", {**COMPLETION, "response_format": {"type": "json_object", "strict": True}},
     "response_format"),
    ("/v1/completions", {**COMPLETION, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "required": ["a"], "properties": {"a": False}}}}},
     "response_format"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"regex": "(("}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"choice": []}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"choice": ["a", 1]}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"json": "{not json"}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"json": [1]}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"grammar": "root ::= foo"}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"grammar": "start: ("}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"grammar": " "}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"grammar": ["start: x"]}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"structural_tag": "{}"}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ("/v1/chat/completions", {**CHAT, "structured_outputs": {"regex": "a"}, "response_format": {
        "type": "json_object"}}, "structured_outputs"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "any", "tools": [
        {"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": [
        {"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": {"type": "function", "name": "f"}, "tools": [
        {"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required", "add_generation_prompt": False, "tools": [
        {"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, "tools[0]"),
    ("/v1/chat/completions", {**CHAT, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    ("/v1/chat/completions", {**CHAT, "use_beam_search": True}, "use_beam_search"),
    ("/v1/chat/completions", {**CHAT, "reasoning_effort": "extreme"}, "reasoning_effort"),
    ("/v1/chat/completions", {**CHAT, "verbosity": "low"}, "verbosity"),
    ("/v1/completions", {"model": "fake"}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": []}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [1, "a"]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": ""}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [10**9]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": ["ok", ""]}, "prompt[1]"),
    ("/v1/completions", {**COMPLETION, "echo": "yes"}, "echo"),
    ("/v1/completions", {**COMPLETION, "suffix": "tail"}, "suffix"),
    ("/v1/completions", {**COMPLETION, "best_of": 2}, "best_of"),
    ("/v1/completions", {**COMPLETION, "logprobs": True}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/completions", {**COMPLETION, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/chat/completions", {**CHAT, "prompt_logprobs": -1}, "prompt_logprobs"),
    ("/v1/completions", {**COMPLETION, "allowed_token_ids": []}, "allowed_token_ids"),
    ("/v1/completions", {**COMPLETION, "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ("/v1/chat/completions", {**CHAT, "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ("/v1/chat/completions", {**CHAT, "return_tokens_as_token_ids": 1}, "return_tokens_as_token_ids"),
    ("/v1/completions", {**COMPLETION, "return_token_ids": "yes"}, "return_token_ids"),
    ("/v1/chat/completions", {**CHAT, "bad_words": 5}, "bad_words"),
    ("/v1/chat/completions", {**CHAT, "priority": 1}, "priority"),
    ("/v1/completions", {**COMPLETION, "priority": "high"}, "priority"),
    ("/v1/chat/completions", {**CHAT, "continue_final_message": True}, "continue_final_message"),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"continue_final_message": True}},
     "chat_template_kwargs.continue_final_message"),
    ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"continuous_usage_stats": 1}},
     "stream_options.continuous_usage_stats"),
    ("/v1/completions", {**COMPLETION, "length_penalty": 0.5}, "length_penalty"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 0, "echo": True}, "max_tokens"),   # 0 only when scoring
    ("/v1/completions", {**COMPLETION, "allowed_token_ids": [-1]}, "allowed_token_ids"),
    ("/v1/chat/completions", {**CHAT, "allowed_token_ids": ["a"]}, "allowed_token_ids"),
    ("/v1/chat/completions", {**CHAT, "allowed_token_ids": [5], "response_format": {"type": "json_object"}},
     "allowed_token_ids"),
    ("/v1/completions", {**COMPLETION, "max_completion_tokens": 5}, "max_completion_tokens"),
    ("/v1/completions", {**COMPLETION, "messages": []}, "messages"),
    ("/tokenize", {"model": "fake"}, "prompt"),
    ("/tokenize", {"model": "fake", "prompt": "a", "extra": 1}, "extra"),
    ("/detokenize", {"model": "fake", "tokens": "abc"}, "tokens"),
    ("/detokenize", {"model": "fake", "tokens": [-1]}, "tokens"),
])
def test_bad_fields_name_the_param(http: httpx.Client, path: str, body: dict, param: str) -> None:
    assert error_of(http.post(path, json=body), 400)["param"] == param


def test_harmless_metadata_and_noop_values_are_accepted(http: httpx.Client) -> None:
    body = {**COMPLETION, "user": "u", "metadata": {"k": "v"}, "store": False, "service_tier": "auto",
            "best_of": 1, "echo": False, "logprobs": None, "repetition_penalty": 1.0, "ignore_eos": True,
            "temperature": 0.0, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    assert http.post("/v1/completions", json=body).status_code == 200  # what vllm bench serve sends
    chat = {**CHAT, "response_format": {"type": "text"}, "parallel_tool_calls": True, "unknown_but_null": None,
            "prompt_cache_key": "k", "safety_identifier": "s", "max_completion_tokens": 3, "priority": 0,
            "length_penalty": 1.0}
    assert http.post("/v1/chat/completions", json=chat).status_code == 200


def test_forcing_a_tool_call_needs_a_line_that_can(http: httpx.Client, fake: FakeEngine, monkeypatch) -> None:
    """A model line whose chat format declares no tool-call opener cannot honour tool_choice "required" or a named
    function: a 400 naming tool_choice, and nothing reaches the engine."""
    from openinfer.text.parsers import ChatFormat
    monkeypatch.setattr(fake, "chat_format", ChatFormat(fake.chat_format.reasoning_parser,
                                                        fake.chat_format.tool_parser))
    before = len(fake.submitted)
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        r = http.post("/v1/chat/completions", json={**CHAT, "tool_choice": choice, "tools": [
            {"type": "function", "function": {"name": "f"}}]})
        err = error_of(r, 400)
        assert (err["param"], err["code"]) == ("tool_choice", "unsupported_parameter")
    assert len(fake.submitted) == before


def test_unknown_model_is_404(http: httpx.Client) -> None:
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION),
                       ("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
        err = error_of(http.post(path, json={**body, "model": "missing"}), 404)
        assert (err["code"], err["param"]) == ("model_not_found", "model")
    assert error_of(http.get("/v1/models/missing"), 404)["code"] == "model_not_found"
    assert error_of(http.get("/no/such/route"), 404)["type"] == "not_found_error"


def test_context_length_says_the_numbers(http: httpx.Client) -> None:
    err = error_of(http.post("/v1/completions", json={"model": "other", "prompt": "hi", "max_tokens": 100}), 400)
    assert err["param"] == "max_tokens" and "64" in err["message"] and "100" in err["message"]
    long = "word " * 100
    err = error_of(http.post("/v1/chat/completions", json={**CHAT, "model": "other",
                                                            "messages": [{"role": "user", "content": long}]}), 400)
    assert err["param"] == "messages" and err["code"] == "context_length_exceeded" and "64" in err["message"]
    # absent max_tokens on completions: the default 16 is clamped to what fits
    r = http.post("/v1/completions", json={"model": "other", "prompt": "word " * 60})
    assert r.status_code == 200, r.text


def test_engine_rejection_is_400_and_failure_500(http: httpx.Client, fake: FakeEngine) -> None:
    fake.kv_tokens = 50
    try:
        err = error_of(http.post("/v1/completions", json={**COMPLETION, "max_tokens": 100}), 400)
        assert err["param"] == "max_tokens" and "KV" in err["message"]
        err = error_of(http.post("/v1/completions", json={**COMPLETION, "max_tokens": 100, "stream": True}), 400)
    finally:
        fake.kv_tokens = 1 << 20

    def boom(prompt: list[int], params: object) -> list[int]:
        raise RuntimeError("scripted engine failure")
    fake.script = boom
    assert "scripted engine failure" in error_of(http.post("/v1/chat/completions", json=CHAT), 500)["message"]
    fake.reset()
    assert http.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_mid_stream_failure_is_an_error_event(server: str, fake: FakeEngine) -> None:
    fake.step_s = 0.002
    with httpx.Client(base_url=server) as http:
        with http.stream("POST", "/v1/completions", json={**COMPLETION, "max_tokens": 1000, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            fake.kill("boom")
            events = [line for line in lines if line]
    fake.dead_reason = None
    assert json.loads(events[-2][len("data: "):])["error"]["message"] == "engine died: boom"
    assert events[-1] == "data: [DONE]"
    # and the openai client raises it
    fake.step_s = 0.002
    with openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0) as client:
        with pytest.raises(openai.APIError, match="engine died"):
            for i, _ in enumerate(client.completions.create(model="fake", prompt="x", max_tokens=1000, stream=True)):
                if i == 2:
                    fake.kill("boom")
    fake.dead_reason = None


def test_mid_stream_failure_of_a_response_is_an_error_event(server: str, fake: FakeEngine) -> None:
    fake.step_s = 0.002
    with httpx.Client(base_url=server) as http:
        body = {"model": "fake", "input": "x", "max_output_tokens": 1000, "stream": True}
        with http.stream("POST", "/v1/responses", json=body) as r:
            lines = r.iter_lines()
            assert next(lines) == "event: response.created"
            fake.kill("boom")
            events = [line for line in lines if line]
    fake.dead_reason = None
    assert events[-2] == "event: error" and not any(line.startswith("data: [DONE]") for line in events)
    last = json.loads(events[-1][len("data: "):])
    assert (last["type"], last["message"], last["code"]) == ("error", "engine died: boom", "engine_error")
    numbers = [json.loads(line[len("data: "):])["sequence_number"] for line in events if line.startswith("data: ")]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))   # the error event keeps the count


def test_dead_engine_health_and_requests(http: httpx.Client, fake: FakeEngine) -> None:
    assert http.get("/health").status_code == 200
    fake.kill("out of memory")
    try:
        err = error_of(http.get("/health"), 503)
        assert "'fake': out of memory" in err["message"]
        assert error_of(http.post("/v1/chat/completions", json=CHAT), 500)["code"] == "engine_dead"
        assert http.post("/v1/completions", json={**COMPLETION, "model": "other"}).status_code == 200
    finally:
        fake.dead_reason = None
    assert http.get("/health").status_code == 200
