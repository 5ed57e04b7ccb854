"""The server driven by the official `openai` client over real HTTP (fake engines, scripted outputs)."""
from __future__ import annotations

import json

import openai
import pytest

from fake_engine import FakeEngine

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>')


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["fake", "other"]
    assert client.models.retrieve("other").id == "other"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_completion_string_prompt_defaults(client: openai.OpenAI, fake: FakeEngine) -> None:
    r = client.completions.create(model="fake", prompt="Say hello")
    assert r.object == "text_completion" and r.model == "fake"
    assert r.choices[0].text == "Hello from the fake engine." and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == len(fake.tokenizer.encode("Say hello"))
    assert r.usage.completion_tokens == len(fake.tokenizer.encode("Hello from the fake engine.")) + 1  # + eos
    assert fake.submitted[-1][2].max_tokens == 16  # OpenAI's default for completions


def test_completion_token_ids_and_batch_with_n_and_seed(client: openai.OpenAI, fake: FakeEngine) -> None:
    tok = fake.tokenizer
    fake.script = lambda prompt, p: tok.encode(f"{tok.decode(prompt)} seed={p.seed}") + [fake.eos]
    r = client.completions.create(model="fake", prompt=tok.encode("ids"), max_tokens=10)
    assert r.choices[0].text == "ids seed=None"
    r = client.completions.create(model="fake", prompt=["a", "b"], n=2, seed=7, max_tokens=10)
    assert [(c.index, c.text) for c in sorted(r.choices, key=lambda c: c.index)] == [
        (0, "a seed=7"), (1, "a seed=8"), (2, "b seed=7"), (3, "b seed=8")]
    assert r.usage.prompt_tokens == 2 and r.usage.completion_tokens == 4 * 5


def test_completion_logprobs(client: openai.OpenAI, fake: FakeEngine) -> None:
    r = client.completions.create(model="fake", prompt="x", logprobs=2, max_tokens=3)
    lp = r.choices[0].logprobs
    assert lp.tokens == ["Hello", " from", " the"]
    assert lp.token_logprobs == [0.0, -0.5, -1.0]
    assert all(1 <= len(top) <= 3 and tok in top for top, tok in zip(lp.top_logprobs, lp.tokens))
    assert lp.text_offset == [0, 5, 10]


def test_completion_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="fake", prompt="x", stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello from the fake engine."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 7


def test_chat_basic_and_default_max_tokens(client: openai.OpenAI, fake: FakeEngine) -> None:
    r = client.chat.completions.create(model="fake", messages=USER)
    m = r.choices[0].message
    assert (m.role, m.content, m.tool_calls, r.choices[0].finish_reason) == \
        ("assistant", "Hello from the fake engine.", None, "stop")
    _, prompt, params = fake.submitted[-1]
    assert params.max_tokens == fake.max_model_len - len(prompt)  # absent: fill the context
    assert fake.tokenizer.decode(prompt, False).endswith("<|im_start|>assistant\n")


def test_chat_content_parts_and_developer_role(client: openai.OpenAI, fake: FakeEngine) -> None:
    client.chat.completions.create(model="fake", max_completion_tokens=5, messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}])
    text = fake.tokenizer.decode(fake.submitted[-1][1], False)
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text and "part one\npart two" in text
    assert fake.submitted[-1][2].max_tokens == 5


def test_chat_reasoning_and_enable_thinking(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say("<think>\nTwo plus two.\n</think>\n\nIt is 4.")
    r = client.chat.completions.create(model="fake", messages=USER)
    m = r.choices[0].message
    assert m.content == "It is 4." and m.model_extra["reasoning_content"] == "Two plus two."
    chunks = list(client.chat.completions.create(model="fake", messages=USER, stream=True))
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == "Two plus two."
    assert "".join(d.content or "" for d in deltas) == "It is 4."
    assert deltas[0].role == "assistant" and all(d.role is None for d in deltas[1:])

    fake.say("Plain answer.")
    client.chat.completions.create(model="fake", messages=USER, extra_body={"chat_template_kwargs": {
        "enable_thinking": False}})
    assert fake.tokenizer.decode(fake.submitted[-1][1], False).endswith("<think>\n\n</think>\n\n")


def test_chat_tool_calls(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say(CALLS)
    r = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert [(t.type, t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls] == [
        ("function", "get_weather", {"city": "Paris"}), ("function", "get_weather", {"city": "Lyon"})]
    assert len({t.id for t in c.message.tool_calls}) == 2
    assert "get_weather" in fake.tokenizer.decode(fake.submitted[-1][1], False)  # the template saw the tools
    # the next turn sends the calls back (content null) with the tool results
    fake.say("Sunny in both.")
    turn = [*USER, c.message.model_dump(exclude_none=True) | {"content": None},
            *({"role": "tool", "tool_call_id": t.id, "content": "sunny"} for t in c.message.tool_calls)]
    r = client.chat.completions.create(model="fake", messages=turn, tools=TOOLS)
    assert r.choices[0].message.content == "Sunny in both."
    prompt = fake.tokenizer.decode(fake.submitted[-1][1], False)
    assert '{"name": "get_weather", "arguments": {"city": "Lyon"}}' in prompt and "<tool_response>\nsunny" in prompt


def test_chat_streamed_tool_call_deltas(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say(CALLS)
    chunks = list(client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, stream=True,
                                                 stream_options={"include_usage": True}))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    calls: dict[int, dict] = {}
    for d in deltas:
        assert d.index is not None and d.function.arguments is not None
        if d.index not in calls:  # first delta of a call: id, type and name
            assert d.id and d.type == "function" and d.function.name == "get_weather"
            calls[d.index] = {"id": d.id, "args": ""}
        else:
            assert d.id is None and d.function.name is None
        calls[d.index]["args"] += d.function.arguments
    assert [json.loads(c["args"]) for c in calls.values()] == [{"city": "Paris"}, {"city": "Lyon"}]
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["tool_calls"] and chunks[-1].usage.completion_tokens > 0


def test_named_tool_choice_forces_that_call(client: openai.OpenAI, fake: FakeEngine) -> None:
    """A named tool_choice ends the prompt with the call's opener and name (after an empty think block, as the
    template writes one with thinking off); the model writes only the arguments, the response has the call, and
    finish_reason is "stop", as OpenAI answers a call it was told to make by name."""
    fake.say('{"city": "Oslo"}}\n</tool_call>')
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, tool_choice=choice)
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.message.content is None   # OpenAI's for a call forced by name
    assert [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls] == [
        ("get_weather", {"city": "Oslo"})]
    prompt = fake.tokenizer.decode(fake.submitted[-1][1], False)
    assert prompt.endswith('<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{"name": "get_weather", '
                           '"arguments": ')
    assert r.usage.completion_tokens == len(fake.tokenizer.encode('{"city": "Oslo"}}\n</tool_call>')) + 1
    chunks = list(client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, tool_choice=choice,
                                                 stream=True))
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    assert json.loads("".join(d.function.arguments for d in deltas)) == {"city": "Oslo"}
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]


def test_required_tool_choice_lets_the_model_name_the_call(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say('get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    r = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, tool_choice="required",
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert [(t.function.name, json.loads(t.function.arguments)) for t in r.choices[0].message.tool_calls] == [
        ("get_weather", {"city": "Rome"})] and r.choices[0].finish_reason == "tool_calls"
    prompt = fake.tokenizer.decode(fake.submitted[-1][1], False)
    assert prompt.endswith('<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{"name": "')
    assert prompt.count("<think>") == 1   # the template's empty block, not a second one
    cut = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, tool_choice="required",
                                         max_tokens=6)
    assert cut.choices[0].finish_reason == "length"   # not "tool_calls": the call's arguments are incomplete


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_is_a_call_with_its_arguments_so_far(client: openai.OpenAI, fake: FakeEngine,
                                                                      stream: bool) -> None:
    """A forced call cut inside its header or its arguments: a tool_calls entry (the name once written, the
    arguments so far), finish_reason "length", and none of the call's markup in content."""
    kw = dict(model="fake", messages=USER, tools=TOOLS, tool_choice="required", stream=stream)
    fake.say('get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')   # 14 tokens
    # cut after `get_weather", "`, after `{"city": "R`, and inside the name (a call without one yet)
    for tokens, name, args in [(4, "get_weather", ""), (11, "get_weather", '{"city": "R'), (2, "", "")]:
        r = client.chat.completions.create(max_tokens=tokens, **kw)
        if stream:
            chunks = [c.choices[0] for c in r if c.choices]
            content = "".join(c.delta.content or "" for c in chunks)
            deltas = [d for c in chunks for d in c.delta.tool_calls or []]
            calls = [(deltas[0].function.name, "".join(d.function.arguments for d in deltas))]
            finish = [c.finish_reason for c in chunks if c.finish_reason]
        else:
            m = r.choices[0].message
            content, finish = m.content or "", [r.choices[0].finish_reason]
            calls = [(t.function.name, t.function.arguments) for t in m.tool_calls]
        assert content == "" and finish == ["length"] and calls == [(name, args)], (tokens, calls)


def test_a_forced_call_with_a_json_format_is_the_call(client: openai.OpenAI, fake: FakeEngine) -> None:
    """As OpenAI answers it (agent stacks send their output schema on every turn): the format applies to text
    answers, and a forced call's output is the call."""
    fake.say('{"city": "Oslo"}}\n</tool_call>')
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, tool_choice=choice,
                                       response_format={"type": "json_object"})
    assert [json.loads(t.function.arguments) for t in r.choices[0].message.tool_calls] == [{"city": "Oslo"}]
    r = client.responses.create(model="fake", input="hi", tools=[{"type": "function", **TOOLS[0]["function"]}],
                                tool_choice={"type": "function", "name": "get_weather"},
                                text={"format": {"type": "json_object"}})
    assert [json.loads(c.arguments) for c in r.output] == [{"city": "Oslo"}]


def test_parallel_tool_calls_false_keeps_the_first_call(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say(CALLS)
    r = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, parallel_tool_calls=False)
    c = r.choices[0]
    assert [json.loads(t.function.arguments) for t in c.message.tool_calls] == [{"city": "Paris"}]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    chunks = list(client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, parallel_tool_calls=False,
                                                 stream=True))
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    assert {d.index for d in deltas} == {0} and json.loads("".join(d.function.arguments for d in deltas)) == {
        "city": "Paris"}
    r = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, parallel_tool_calls=True)
    assert len(r.choices[0].message.tool_calls) == 2


def test_reasoning_effort_switches_thinking(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say("Plain.")
    client.chat.completions.create(model="fake", messages=USER, reasoning_effort="low")
    assert not fake.tokenizer.decode(fake.submitted[-1][1], False).endswith("</think>\n\n")
    for effort in ("none", "minimal"):
        client.chat.completions.create(model="fake", messages=USER, reasoning_effort=effort)
        assert fake.tokenizer.decode(fake.submitted[-1][1], False).endswith("<think>\n\n</think>\n\n")
    client.chat.completions.create(model="fake", messages=USER, reasoning_effort="minimal",   # the explicit switch wins
                                   extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert not fake.tokenizer.decode(fake.submitted[-1][1], False).endswith("</think>\n\n")


def test_reasoning_effort_on_a_line_that_does_not_reason(client: openai.OpenAI, fake: FakeEngine,
                                                         monkeypatch) -> None:
    from openinfer.text.parsers import ChatFormat
    monkeypatch.setattr(fake, "chat_format", ChatFormat(tool_parser=fake.chat_format.tool_parser))
    fake.say("Plain.")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=USER, reasoning_effort="high")
    assert e.value.body["param"] == "reasoning_effort" and not fake.submitted
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="fake", input="hi", reasoning={"effort": "low"})
    assert e.value.body["param"] == "reasoning.effort"
    assert client.chat.completions.create(model="fake", messages=USER, reasoning_effort="none").choices[0]


def test_tool_choice_none_keeps_calls_as_text(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say(CALLS)
    r = client.chat.completions.create(model="fake", messages=USER, tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content
    assert "get_weather" not in fake.tokenizer.decode(fake.submitted[-1][1], False)


def test_chat_logprobs_and_n_streaming(client: openai.OpenAI, fake: FakeEngine) -> None:
    r = client.chat.completions.create(model="fake", messages=USER, logprobs=True, top_logprobs=2, max_tokens=2)
    content = r.choices[0].logprobs.content
    assert [e.token for e in content] == ["Hello", " from"] and content[0].bytes == list(b"Hello")
    assert [len(e.top_logprobs) for e in content] == [2, 2] and content[1].top_logprobs[0].logprob == -0.5
    chunks = list(client.chat.completions.create(model="fake", messages=USER, n=3, seed=1, stream=True))
    by_index: dict[int, str] = {}
    for c in chunks:
        ch = c.choices[0]
        if ch.index not in by_index:
            assert ch.delta.role == "assistant"
        by_index[ch.index] = by_index.get(ch.index, "") + (ch.delta.content or "")
    assert by_index == {i: "Hello from the fake engine." for i in range(3)}
    assert sorted(p.seed for _, _, p in fake.submitted[-3:]) == [1, 2, 3]


def test_stop_strings(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say("Hello world, this is a stop test.")
    r = client.completions.create(model="fake", prompt="x", stop=[" is a", "zzz"], max_tokens=50)
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("Hello world, this", "stop")
    assert fake.aborted == [fake.submitted[-1][0]]  # the engine request was cut short
    r = client.completions.create(model="fake", prompt="x", stop=" is a", max_tokens=50,
                                  extra_body={"include_stop_str_in_output": True})
    assert r.choices[0].text == "Hello world, this is a"
    chunks = list(client.chat.completions.create(model="fake", messages=USER, stop="s a s", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello world, this i"
    r = client.completions.create(model="fake", prompt="x", stop="Hello", extra_body={"min_tokens": 1})
    assert r.choices[0].text.startswith("Hello world")  # stop strings wait for min_tokens


def test_stop_token_ids_skip_special_and_ignore_eos(client: openai.OpenAI, fake: FakeEngine) -> None:
    tok = fake.tokenizer
    fake.say("one, two<|object_ref_start|> three")
    comma = tok.encode(",")[0]
    r = client.completions.create(model="fake", prompt="x", extra_body={"stop_token_ids": [comma]})
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("one", "stop")
    r = client.completions.create(model="fake", prompt="x", extra_body={"skip_special_tokens": False})
    assert r.choices[0].text == "one, two<|object_ref_start|> three"  # the eos stop token still omitted
    assert client.completions.create(model="fake", prompt="x").choices[0].text == "one, two three"
    r = client.completions.create(model="fake", prompt="x", max_tokens=12, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12


def test_sampling_params_reach_the_engine(client: openai.OpenAI, fake: FakeEngine) -> None:
    client.chat.completions.create(model="fake", messages=USER, temperature=0.5, top_p=0.9, presence_penalty=0.1,
                                   frequency_penalty=0.2, logit_bias={"42": 5}, seed=3, extra_body={
                                       "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 2})
    p = fake.submitted[-1][2]
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.presence_penalty, p.frequency_penalty,
            p.repetition_penalty, p.logit_bias, p.seed, p.min_tokens) == (0.5, 0.9, 20, 0.05, 0.1, 0.2, 1.1,
                                                                            {42: 5.0}, 3, 2)


def test_cached_tokens_and_model_selection(client: openai.OpenAI, engines: dict[str, FakeEngine]) -> None:
    prompt = "a long shared prefix for the prefix cache " * 3
    client.completions.create(model="other", prompt=prompt, max_tokens=2)
    r = client.completions.create(model="other", prompt=prompt, max_tokens=2)
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1
    assert engines["other"].submitted and not engines["fake"].submitted
