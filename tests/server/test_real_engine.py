"""The server over the real engine (the built-in demo model: tiny random Qwen3, real tokenizer)."""
from __future__ import annotations

from typing import Iterator

import httpx
import openai
import pytest

from server_harness import post, wait_until
from openinfer.engine.engine import Engine

USER = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture
def client(url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as c:
        yield c


def test_completion_and_chat(client: openai.OpenAI) -> None:
    r = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=8, temperature=0,
                                  logprobs=3, extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert r.usage.completion_tokens == 8 and c.finish_reason == "length" and len(c.logprobs.tokens) == 8
    assert all(lp <= 0 for lp in c.logprobs.token_logprobs)
    again = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert again.choices[0].text == c.text  # greedy is deterministic
    chunks = list(client.chat.completions.create(model="demo", messages=USER, max_tokens=6, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].usage.prompt_tokens > 0


def test_seeded_choices(client: openai.OpenAI) -> None:
    kw = dict(model="demo", prompt="The seed", max_tokens=6, temperature=1.0, extra_body={"ignore_eos": True})
    # choice i samples with seed + i. Both calls run two rows of the same prompt, so the logits are
    # bit-identical (a lone request would run other GEMM shapes, whose rounding can flip a draw)
    first = sorted(client.completions.create(n=2, seed=5, **kw).choices, key=lambda c: c.index)
    shifted = sorted(client.completions.create(n=2, seed=4, **kw).choices, key=lambda c: c.index)
    assert shifted[1].text == first[0].text and first[0].text != first[1].text


def test_stop_string_cuts_and_aborts(client: openai.OpenAI, engine: Engine) -> None:
    kw = dict(model="demo", prompt="Stop somewhere", temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(max_tokens=12, **kw).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = client.completions.create(max_tokens=200, stop=[stop], **kw).choices[0]
    assert cut.finish_reason == "stop" and cut.text == full[:full.find(stop)]
    assert wait_until(lambda: engine.stats().num_running == 0 and engine.stats().kv_usage == 0.0)


def test_prefix_cache_reported(client: openai.OpenAI) -> None:
    prompt = "A shared prefix that spans more than a few KV blocks of sixteen tokens each. " * 4
    client.completions.create(model="demo", prompt=prompt, max_tokens=1)
    r = client.completions.create(model="demo", prompt=prompt, max_tokens=1)
    assert r.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 16


def test_cache_salt_keeps_prefix_caches_apart(client: openai.OpenAI) -> None:
    """vLLM's cache_salt: a prompt hits the blocks of an earlier one only under the same salt (or none)."""
    prompt = "Salted prefixes are cached per tenant, across more than a few blocks of sixteen tokens. " * 4

    def cached(salt: str | None, chat: bool = False) -> int:
        extra = {} if salt is None else {"cache_salt": salt}
        if chat:
            r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}],
                                               max_tokens=1, extra_body=extra)
        else:
            r = client.completions.create(model="demo", prompt=prompt, max_tokens=1, extra_body=extra)
        return r.usage.prompt_tokens_details.cached_tokens
    assert cached("tenant-a") == 0
    assert cached("tenant-b") == 0 and cached(None) == 0   # other salts, and no salt, miss it
    assert cached("tenant-a") > 0 and cached("tenant-b") > 0 and cached(None) > 0
    assert cached("tenant-c", chat=True) == 0 and cached("tenant-c", chat=True) > 0
    for bad in ("", 7):
        with pytest.raises(openai.BadRequestError, match="cache_salt"):
            cached(bad)


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_returns_kv_to_the_pool(url: str, engine: Engine, stream: bool) -> None:
    sock = post(url, "/v1/chat/completions", {"model": "demo", "messages": USER, "n": 2, "stream": stream,
                                              "ignore_eos": True, "max_tokens": 400})
    assert wait_until(lambda: engine.stats().num_running == 2 and engine.stats().kv_usage > 0)
    sock.close()
    assert wait_until(lambda: engine.stats().num_running == 0 and engine.stats().kv_usage == 0.0)


def test_errors_from_the_real_engine(url: str) -> None:
    with httpx.Client(base_url=url) as http:
        r = http.post("/v1/completions", json={"model": "demo", "prompt": "x", "max_tokens": 600})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        r = http.post("/v1/completions", json={"model": "demo", "prompt": [151935], "max_tokens": 2})
        assert r.status_code == 200  # ids past the tokenizer's vocabulary but inside the model's are fine
        assert http.get("/health").status_code == 200
        assert 'vllm:kv_cache_usage_perc{model_name="demo"}' in http.get("/metrics").text


def test_echo_with_logprobs_scores_the_prompt(client: openai.OpenAI, url: str) -> None:
    """lm-eval's loglikelihood request: echo, logprobs 1, max_tokens 1, token-id prompts."""
    text = "The quick brown fox jumps over the lazy dog"
    ids = httpx.post(url + "/tokenize", json={"model": "demo", "prompt": text}).json()["tokens"]
    kw = dict(model="demo", max_tokens=1, temperature=0, logprobs=1, echo=True)
    r = client.completions.create(prompt=[ids], **kw).choices[0]
    lp = r.logprobs
    assert r.text.startswith(text) and len(lp.tokens) == len(ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset[:3] == [0, len(lp.tokens[0]), len(lp.tokens[0]) + len(lp.tokens[1])]
    vllm = client.completions.create(prompt=[ids], model="demo", max_tokens=1, temperature=0,
                                     extra_body={"prompt_logprobs": 2}).choices[0].model_extra["prompt_logprobs"]
    assert vllm[0] is None and len(vllm) == len(ids)
    for i, (token, entry) in enumerate(zip(ids[1:], vllm[1:]), 1):
        own = entry[str(token)]
        assert own["logprob"] == pytest.approx(lp.token_logprobs[i], abs=1e-5)
        assert len(entry) <= 3 and {1, 2} <= {e["rank"] for e in entry.values()}   # the token and the top 2
        # lm-eval's is_greedy: the token's logprob equals the best of top_logprobs exactly when it ranks first
        assert (lp.token_logprobs[i] == max(lp.top_logprobs[i].values())) == (own["rank"] == 1)
    assert client.completions.create(prompt=text, model="demo", max_tokens=1, echo=True).choices[0].text.startswith(text)


def test_echo_streams_the_prompt_first(client: openai.OpenAI) -> None:
    kw = dict(model="demo", prompt="Echo me, then go on", max_tokens=5, temperature=0, logprobs=2, echo=True,
              extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
    assert chunks[0].text.startswith("Echo me, then go on")
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.logprobs.tokens] == whole.logprobs.tokens
    assert [v for c in chunks for v in c.logprobs.token_logprobs] == whole.logprobs.token_logprobs


def test_chat_prompt_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="demo", messages=USER, max_tokens=2,
                                       extra_body={"prompt_logprobs": 0})
    lps = r.model_extra["prompt_logprobs"]
    assert len(lps) == r.usage.prompt_tokens and lps[0] is None
    assert all(len(e) == 1 and next(iter(e.values()))["rank"] >= 1 for e in lps[1:])
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_allowed_token_ids(client: openai.OpenAI, url: str) -> None:
    allowed = httpx.post(url + "/tokenize", json={"model": "demo", "prompt": " yes no maybe"}).json()["tokens"]
    for temperature in (0, 1.0):
        r = client.completions.create(model="demo", prompt="Answer:", max_tokens=5, temperature=temperature, seed=1,
                                      extra_body={"allowed_token_ids": allowed, "ignore_eos": True,
                                                  "return_tokens_as_token_ids": True}, logprobs=0)
        assert r.choices[0].logprobs.tokens and all(int(t.split(":")[1]) in allowed for t in r.choices[0].logprobs.tokens)


def test_truncate_prompt_tokens(client: openai.OpenAI, url: str) -> None:
    text = "one two three four five six seven eight"
    ids = httpx.post(url + "/tokenize", json={"model": "demo", "prompt": text}).json()["tokens"]
    kw = dict(model="demo", max_tokens=2, temperature=0, echo=True, extra_body={"truncate_prompt_tokens": 3})
    r = client.completions.create(prompt=text, **kw)
    tail = httpx.post(url + "/detokenize", json={"model": "demo", "tokens": ids[-3:]}).json()["prompt"]
    assert r.usage.prompt_tokens == 3 and r.choices[0].text.startswith(tail) and not r.choices[0].text.startswith(text)
    assert r.choices[0].text == client.completions.create(prompt=[ids[-3:]], model="demo", max_tokens=2, temperature=0,
                                                          echo=True).choices[0].text
    whole = client.completions.create(prompt=text, **{**kw, "extra_body": {"truncate_prompt_tokens": 50}})
    assert whole.usage.prompt_tokens == len(ids) and whole.choices[0].text.startswith(text)
    chat = client.chat.completions.create(model="demo", messages=USER, max_tokens=1,
                                          extra_body={"truncate_prompt_tokens": 5})
    assert chat.usage.prompt_tokens == 5


def test_chat_logprobs_name_tokens_by_id(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="demo", messages=USER, max_tokens=3, logprobs=True, top_logprobs=2,
                                       extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 3 and all(e.token.startswith("token_id:") for e in content)
    assert all(t.token.startswith("token_id:") for e in content for t in e.top_logprobs)


def test_return_token_ids(client: openai.OpenAI, url: str) -> None:
    extra = {"return_token_ids": True, "ignore_eos": True}
    kw = dict(model="demo", prompt="Token ids, please", max_tokens=6, temperature=0, extra_body=extra)
    whole = client.completions.create(**kw).choices[0].model_extra
    ids = httpx.post(url + "/tokenize", json={"model": "demo", "prompt": "Token ids, please"}).json()["tokens"]
    assert whole["prompt_token_ids"] == ids and len(whole["token_ids"]) == 6
    chunks = [c.choices[0].model_extra for c in client.completions.create(stream=True, **kw) if c.choices]
    assert chunks[0]["prompt_token_ids"] == ids and all("prompt_token_ids" not in c for c in chunks[1:])
    assert [t for c in chunks for t in c["token_ids"]] == whole["token_ids"]

    chat = dict(model="demo", messages=USER, max_tokens=5, temperature=0, extra_body=extra)
    r = client.chat.completions.create(**chat)
    assert len(r.model_extra["prompt_token_ids"]) == r.usage.prompt_tokens
    assert len(r.choices[0].model_extra["token_ids"]) == r.usage.completion_tokens == 5
    stream = list(client.chat.completions.create(stream=True, **chat))
    assert stream[0].model_extra["prompt_token_ids"] == r.model_extra["prompt_token_ids"]
    assert all("prompt_token_ids" not in c.model_extra for c in stream[1:])
    assert [t for c in stream for t in c.choices[0].model_extra["token_ids"]] == r.choices[0].model_extra["token_ids"]


def test_echo_scores_the_prompt_alone_at_max_tokens_0(client: openai.OpenAI) -> None:
    """Older lm-eval sends max_tokens 0: the prompt, scored, and no completion."""
    kw = dict(model="demo", prompt="Score this prompt only", max_tokens=0, echo=True, logprobs=2)
    r = client.completions.create(**kw)
    c = r.choices[0]
    assert c.text == "Score this prompt only" and c.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and len(c.logprobs.tokens) == r.usage.prompt_tokens
    assert c.logprobs.token_logprobs[0] is None and all(v <= 0 for v in c.logprobs.token_logprobs[1:])
    streamed = [ch.choices[0] for ch in client.completions.create(stream=True, **kw) if ch.choices]
    assert "".join(ch.text for ch in streamed) == c.text
    assert [v for ch in streamed for v in ch.logprobs.token_logprobs] == c.logprobs.token_logprobs


def test_bad_words(client: openai.OpenAI, engine: Engine) -> None:
    from openinfer.server.protocol import bad_words_ids
    tok = engine.tokenizer
    assert bad_words_ids(tok, ["hello"]) == [tok.encode("hello", add_special_tokens=False),
                                             tok.encode(" hello", add_special_tokens=False)]
    kw = dict(model="demo", prompt="Say it:", max_tokens=6, temperature=0)
    first = client.completions.create(extra_body={"return_token_ids": True, "ignore_eos": True}, **kw)
    t0 = first.choices[0].model_extra["token_ids"][0]
    word = tok.decode([t0])
    banned = client.completions.create(extra_body={"return_token_ids": True, "ignore_eos": True,
                                                   "bad_words": [word]}, **kw)
    ids = banned.choices[0].model_extra["token_ids"]
    assert t0 in [seq[-1] for seq in bad_words_ids(tok, [word])] and t0 not in ids


def test_choices_compute_their_prompt_once(client: openai.OpenAI, engine: Engine) -> None:
    prompt = "Three greedy choices of one prompt long enough to fill a few KV blocks of sixteen tokens. " * 2
    before = engine.stats().prefix_hits
    r = client.completions.create(model="demo", prompt=prompt, n=3, max_tokens=4, temperature=0)
    full = (r.usage.prompt_tokens - 1) // 16 * 16
    assert full >= 32 and engine.stats().prefix_hits - before == 2 * full   # the two followers hit the first's blocks
    assert len({c.text for c in r.choices}) == 1


def test_continuous_usage_stats(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="demo", prompt="Count the tokens", max_tokens=5, stream=True,
                                            extra_body={"ignore_eos": True},
                                            stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == 5 and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for c in chunks)


def test_continue_final_message(client: openai.OpenAI, url: str) -> None:
    """The prompt ends inside the assistant's prefill, which the model continues: /tokenize and chat agree on it."""
    messages = [*USER, {"role": "assistant", "content": "Once upon a"}]
    flags = {"continue_final_message": True, "add_generation_prompt": False}
    ids = httpx.post(url + "/tokenize", json={"model": "demo", "messages": messages, **flags}).json()["tokens"]
    text = httpx.post(url + "/detokenize", json={"model": "demo", "tokens": ids}).json()["prompt"]
    assert text.endswith("assistant\n<think>\n\n</think>\n\nOnce upon a")
    r = client.chat.completions.create(model="demo", messages=messages, max_tokens=3, temperature=0,
                                       extra_body={**flags, "ignore_eos": True})
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 3
