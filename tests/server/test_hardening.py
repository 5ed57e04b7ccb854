"""The server against a careless or hostile client: every mistake a 400 (413, 408) in the OpenAI envelope naming
its field, the connection kept; bounded work (body size, read time, prompt length before tokenizing, sequences per
request, stored-response bytes); tenants apart (stored responses, prefix cache, /metrics)."""
from __future__ import annotations

import json
import socket
from typing import Iterator

import httpx
import pytest

from fake_engine import FakeEngine, demo_tokenizer
from openinfer.server import ModelHost
from openinfer.server.limits import ServerLimits
from server_harness import LiveServer

S = "\\ud800"   # a lone surrogate, as JSON text spells it
CHAT = '{"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4'
KEYS = ("sk-a", "sk-b")


def _post(http: httpx.Client, path: str, raw: str) -> httpx.Response:
    return http.post(path, content=raw.encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("path,raw,param", [
    ("/v1/chat/completions", '{"model": "fa' + S + 'ke", "messages": [{"role": "user", "content": "Hi"}]}', "model"),
    ("/v1/completions", '{"model": "fake", "prompt": "a' + S + '", "stream": true}', "prompt"),
    ("/v1/chat/completions", '{"model": "fake", "messages": [{"role": "user", "content": "' + S + '"}]}',
     "messages[0].content"),
    ("/v1/responses", '{"model": "fake", "input": "Hi", "instructions": "' + S + '"}', "instructions"),
    ("/v1/completions", '{"model": "fake", "prompt": "a", "bad_words": ["' + S + '"]}', "bad_words[0]"),
    ("/v1/chat/completions", CHAT + ', "tools": [{"type": "function", "function": {"name": "f", "parameters": '
     '{"type": "object", "properties": {"' + S + '": {"type": "string"}}}}}]}',
     "tools[0].function.parameters.properties.?"),
    ("/v1/responses", '{"model": "fake", "input": "Hi", "metadata": {"k": "' + S + '"}}', "metadata.k"),
    ("/tokenize", '{"model": "fake", "prompt": "x", "' + S + '": 1}', "?"),
    ("/v1/completions", '{"model": "fake", "prompt": "a", "seed": 9223372036854775808}', "seed"),
    ("/tokenize", '{"model": "fake", "prompt": null}', "prompt"),
    ("/detokenize", '{"model": "fake", "tokens": ' + "[" * 1000 + "]" * 1000 + "}", None),
    ("/v1/chat/completions", CHAT + ', "tools": ' + "[" * 100 + "]" * 100 + "}", None),
    ("/v1/responses", '{"model": "fake", "input": "Hi", "metadata": {"k": "' + "v" * 513 + '"}}', "metadata"),
    ("/v1/chat/completions", CHAT + ', "response_format": {"type": "json_schema", "json_schema": {"name": "x", '
     '"schema": {"$ref": "#"}}}, "stream": true}', "response_format"),
    ("/v1/completions", '{"model": "fake", "prompt": "a", "structured_outputs": {"regex": "a{1000000}"}}',
     "structured_outputs"),
])
def test_client_mistakes_are_400s_naming_the_field_and_keep_the_connection(http: httpx.Client, fake: FakeEngine,
                                                                           path: str, raw: str, param: str) -> None:
    r = _post(http, path, raw)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.headers.get("connection") != "close"
    assert not fake.submitted
    assert _post(http, "/v1/chat/completions", CHAT + "}").status_code == 200   # the same connection goes on


def test_a_negative_seed_is_honoured(http: httpx.Client, fake: FakeEngine) -> None:
    r = _post(http, "/v1/completions", '{"model": "fake", "prompt": "a", "seed": -1, "n": 2}')
    assert r.status_code == 200, r.text
    assert [p.seed for _, _, p in fake.submitted] == [-1, 0]


@pytest.fixture(scope="module")
def bounded(engines: dict[str, FakeEngine]) -> Iterator[str]:
    limits = ServerLimits(max_body_bytes=4096, read_timeout_s=0.5)
    with LiveServer(ModelHost(engines, max_sequences_per_request=4), limits=limits) as url:
        yield url


def test_a_body_over_the_limit_is_a_413_read_or_not(bounded: str, fake: FakeEngine) -> None:
    big = json.dumps({"model": "fake", "prompt": "x" * 5000}).encode()
    r = httpx.post(bounded + "/v1/completions", content=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.post(bounded + "/v1/completions", content=iter([big[:3000], big[3000:]]))   # chunked: no length
    assert r.status_code == 413 and not fake.submitted


def test_a_body_that_never_arrives_is_a_408(bounded: str) -> None:
    host, port = bounded.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\"")
        answer = b""
        while chunk := sock.recv(65536):   # the server closes the connection after its answer: read it all
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer


def test_sequences_per_request_are_capped(bounded: str, fake: FakeEngine) -> None:
    r = httpx.post(bounded + "/v1/completions", json={"model": "fake", "prompt": ["a", "b", "c"], "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = httpx.post(bounded + "/v1/completions", json={"model": "fake", "prompt": ["a"] * 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(bounded + "/v1/chat/completions", json={"model": "fake", "n": 5,
                                                           "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 400 and "--max-sequences-per-request" in r.json()["error"]["message"]
    assert not fake.submitted
    r = httpx.post(bounded + "/v1/completions", json={"model": "fake", "prompt": ["a", "b"], "n": 2, "max_tokens": 2})
    assert r.status_code == 200 and len(r.json()["choices"]) == 4


def test_an_impossible_prompt_is_refused_before_tokenizing(http: httpx.Client, fake: FakeEngine,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    tok = demo_tokenizer()
    encoded = []
    monkeypatch.setattr(tok, "encode", lambda text, *a, **k: encoded.append(len(text)) or [1])
    text = "y" * (64 * tok._length_bound[1])   # "other" serves 64 tokens
    for path, body in (("/v1/completions", {"prompt": text}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]})):
        r = http.post(path, json={"model": "other", **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "context_length_exceeded" and "at least" in r.json()["error"]["message"]
    assert not encoded and not fake.submitted


@pytest.mark.parametrize("text", ["hello world " * 300, "e\u0301" * 2000, "\u1100\u1161\u11a8" * 500, "🙂" * 999,
                                  " " * 4000, "<|im_start|>" * 50])
def test_the_token_lower_bound_holds(text: str) -> None:
    tok = demo_tokenizer()
    assert 0 < tok.min_tokens(text) <= len(tok.encode(text))


@pytest.fixture(scope="module")
def keyed(engines: dict[str, FakeEngine]) -> Iterator[str]:
    with LiveServer(ModelHost(engines), api_keys=KEYS) as url:
        yield url


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_stored_response_belongs_to_its_key(keyed: str, fake: FakeEngine) -> None:
    made = httpx.post(keyed + "/v1/responses", json={"model": "fake", "input": "Hi"}, headers=_as("sk-a")).json()
    rid = made["id"]
    for method, path, body in (("GET", f"/v1/responses/{rid}", None), ("GET", f"/v1/responses/{rid}/input_items", None),
                               ("POST", f"/v1/responses/{rid}/cancel", None), ("DELETE", f"/v1/responses/{rid}", None),
                               ("POST", "/v1/responses", {"model": "fake", "input": "Go on",
                                                          "previous_response_id": rid})):
        r = httpx.request(method, keyed + path, json=body, headers=_as("sk-b"))
        assert r.status_code == 404, (method, path, r.text)
    assert httpx.get(keyed + f"/v1/responses/{rid}", headers=_as("sk-a")).json()["id"] == rid
    assert httpx.delete(keyed + f"/v1/responses/{rid}", headers=_as("sk-a")).status_code == 200


def test_the_prefix_cache_is_partitioned_by_key_then_by_cache_salt(keyed: str, engines: dict[str, FakeEngine],
                                                                   fake: FakeEngine) -> None:
    def salt(url: str, key: str, cache_salt: str | None = None) -> str:
        body = {"model": "fake", "prompt": "a", "max_tokens": 1, **({"cache_salt": cache_salt} if cache_salt else {})}
        assert httpx.post(url + "/v1/completions", json=body, headers=_as(key)).status_code == 200
        return fake.salts[fake.submitted[-1][0]]

    a, b = salt(keyed, "sk-a"), salt(keyed, "sk-b")
    assert a != b and salt(keyed, "sk-a") == a
    assert salt(keyed, "sk-a", "s1") not in (a, b, salt(keyed, "sk-a", "s2"), salt(keyed, "sk-b", "s1"))
    with LiveServer(ModelHost(engines), api_keys=KEYS, limits=ServerLimits(shared_prefix_cache=True)) as shared:
        assert salt(shared, "sk-a") == salt(shared, "sk-b") == ""
        assert salt(shared, "sk-a", "s1") == "s1"
