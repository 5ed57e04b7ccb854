"""/tokenize, /detokenize, /health and /metrics over raw HTTP."""
from __future__ import annotations

import re

import httpx

from fake_engine import FakeEngine


def test_tokenize_prompt_and_messages(http: httpx.Client, fake: FakeEngine) -> None:
    r = http.post("/tokenize", json={"model": "fake", "prompt": "Hello world"}).json()
    assert r == {"tokens": fake.tokenizer.encode("Hello world"), "count": 2, "max_model_len": 4096}
    messages = [{"role": "user", "content": "hi"}]
    r = http.post("/tokenize", json={"model": "other", "messages": messages,
                                     "chat_template_kwargs": {"enable_thinking": False}}).json()
    text = fake.tokenizer.apply_chat_template(messages, enable_thinking=False)
    assert r["tokens"] == fake.tokenizer.encode(text) and r["max_model_len"] == 64
    # what /v1/chat/completions would send for the same conversation
    http.post("/v1/chat/completions", json={"model": "fake", "messages": messages, "max_tokens": 1,
                                            "chat_template_kwargs": {"enable_thinking": False}})
    assert fake.submitted[-1][1] == r["tokens"]


def test_detokenize(http: httpx.Client, fake: FakeEngine) -> None:
    ids = fake.tokenizer.encode("Round trip, ok?")
    assert http.post("/detokenize", json={"model": "fake", "tokens": ids}).json() == {"prompt": "Round trip, ok?"}


def test_metrics_exposition(http: httpx.Client) -> None:
    http.post("/v1/completions", json={"model": "fake", "prompt": "metrics please", "max_tokens": 3})
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = r.text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total"):
        assert re.search(rf'^{name}{{.*model_name="fake".*}} \d', text, re.M), name
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds"):
        assert f"# TYPE {name} histogram" in text
        count = float(re.search(rf'^{name}_count{{model_name="fake"}} (\S+)$', text, re.M).group(1))
        inf = float(re.search(rf'^{name}_bucket{{le="\+Inf",model_name="fake"}} (\S+)$', text, re.M).group(1))
        assert count == inf > 0
    assert 'vllm:request_success_total{finished_reason="length",model_name="fake"}' in text
    # every sample line is `name{labels} number`
    for line in text.splitlines():
        assert line.startswith("# ") or re.fullmatch(r'[a-z0-9_:]+(\{[^}]*\})? (\S+)', line), line


def test_the_models_sampling_defaults_fill_what_a_request_leaves_out(http: httpx.Client, fake: FakeEngine) -> None:
    fake.sampling_defaults = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    try:
        http.post("/v1/chat/completions", json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]})
        http.post("/v1/completions", json={"model": "fake", "prompt": "hi", "temperature": 0, "top_p": 1})
    finally:
        fake.sampling_defaults = {}
    (_, _, chat), (_, _, done) = fake.submitted[-2:]
    assert (chat.temperature, chat.top_k, chat.top_p) == (0.6, 20, 0.95)
    assert (done.temperature, done.top_k, done.top_p) == (0.0, 20, 1.0)   # the request's own values win, field by field
    http.post("/v1/completions", json={"model": "fake", "prompt": "hi"})
    assert (fake.submitted[-1][2].temperature, fake.submitted[-1][2].top_k) == (1.0, -1)   # no defaults: OpenAI's


def test_priority_reaches_the_engine_under_the_priority_policy(http: httpx.Client, fake: FakeEngine) -> None:
    fake.scheduling_policy = "priority"   # (reset per test)
    r = http.post("/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 2, "priority": -3, "n": 2})
    assert r.status_code == 200 and sorted(fake.priorities.values()) == [-3, -3]   # every choice of the request
    r = http.post("/v1/chat/completions", json={"model": "fake", "messages": [{"role": "user", "content": "hi"}],
                                                "max_tokens": 2, "priority": 7})
    assert r.status_code == 200 and list(fake.priorities.values())[-1] == 7
