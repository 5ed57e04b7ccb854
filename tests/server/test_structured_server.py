"""response_format and structured_outputs through the real server and engine (the built-in demo model), driven
by the openai client: JSON that satisfies the schema on both endpoints, streamed and not, with n, seed, logprobs
and usage; choices and patterns; the grammar after the reasoning block; a bad schema is a 400 and the server
keeps serving."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import openai
import pytest

from openinfer.engine.engine import Engine
from openinfer.testing.structured import PERSON, check_person

USER = [{"role": "user", "content": "Describe a person as JSON."}]
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}   # the prompt closes the reasoning block


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[openai.OpenAI]:   # `engine` and `url`: the demo model's (conftest.py)
    with openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as c:
        yield c


def test_chat_json_schema_streamed_and_not(client: openai.OpenAI) -> None:
    kw = dict(model="demo", messages=USER, response_format=PERSON_FORMAT, max_tokens=250, temperature=0,
              extra_body=NO_THINKING)
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "stop"
    check_person(json.loads(c.message.content))
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    deltas = [ch.choices[0].delta.content or "" for ch in chunks if ch.choices]
    assert len([d for d in deltas if d]) > 5 and "".join(deltas) == c.message.content   # streamed as it comes
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens > 0


def test_chat_n_seed_logprobs(client: openai.OpenAI) -> None:
    kw = dict(model="demo", messages=USER, response_format=PERSON_FORMAT, max_tokens=250, temperature=1.0, n=2,
              seed=11, logprobs=True, top_logprobs=2, extra_body=NO_THINKING)
    r = client.chat.completions.create(**kw)
    texts = []
    for c in sorted(r.choices, key=lambda c: c.index):
        assert c.finish_reason == "stop"
        check_person(json.loads(c.message.content))
        assert all(lp.logprob <= 0 and len(lp.top_logprobs) == 2 for lp in c.logprobs.content)
        texts.append(c.message.content)
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    again = client.chat.completions.create(**kw)
    assert [c.message.content for c in sorted(again.choices, key=lambda c: c.index)] == texts   # seeded


def test_completions_accept_response_format(client: openai.OpenAI, engine: Engine) -> None:
    r = client.completions.create(model="demo", prompt="A person:", max_tokens=250, temperature=0,
                                  extra_body={"response_format": PERSON_FORMAT})
    assert r.choices[0].finish_reason == "stop"
    check_person(json.loads(r.choices[0].text))
    bias = {str(engine.tokenizer.encode(t)[0]): 30 for t in ['}', '"', '":', '"}', ',"']}
    chunks = list(client.completions.create(model="demo", prompt="Some JSON:", max_tokens=100, temperature=1.0,
                                            seed=3, logit_bias=bias, stream=True,
                                            extra_body={"response_format": {"type": "json_object"}}))
    assert isinstance(json.loads("".join(ch.choices[0].text for ch in chunks)), dict)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_structured_outputs_choice_regex_and_json(client: openai.OpenAI) -> None:
    """vLLM's `structured_outputs`: one of the choices as written, a pattern, a schema given as JSON text."""
    choices = ["yes, sir!", "no (way)", "maybe?"]
    for seed in range(3):
        r = client.completions.create(model="demo", prompt="Answer:", max_tokens=20, temperature=1.0, seed=seed,
                                      extra_body={"structured_outputs": {"choice": choices}})
        assert r.choices[0].text in choices and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model="demo", prompt="A code:", max_tokens=20, temperature=0,
                                  extra_body={"structured_outputs": {"regex": "[A-Z]{2}-[0-9]{3}"}})
    assert re.fullmatch("[A-Z]{2}-[0-9]{3}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="demo", messages=USER, max_tokens=250, temperature=0, extra_body={
        **NO_THINKING, "structured_outputs": {"json": json.dumps(PERSON)}})
    check_person(json.loads(r.choices[0].message.content))


def test_structured_outputs_grammar_streamed_and_not(client: openai.OpenAI) -> None:
    """A context-free grammar (GBNF, as vLLM's clients write it): balanced brackets, which no regex matches."""
    grammar = 'root ::= group\ngroup ::= "(" (group* | [a-z]{1,3}) ")"'

    def group(s: str, i: int) -> int:
        """The end of the group starting at s[i] (-1: none): a word, or groups side by side, in brackets."""
        if not s.startswith("(", i):
            return -1
        word = re.match(r"[a-z]{1,3}", s[i + 1:])
        i = i + 1 + (word.end() if word else 0)
        while not word and s.startswith("(", i):
            i = group(s, i)
            if i < 0:
                return -1
        return i + 1 if s.startswith(")", i) else -1

    for seed in range(3):
        body = {"structured_outputs": {"grammar": grammar}}
        r = client.completions.create(model="demo", prompt="Nest:", max_tokens=40, temperature=1.0, seed=seed,
                                      extra_body=body)
        text = r.choices[0].text
        assert r.choices[0].finish_reason == "stop" and group(text, 0) == len(text), text
        chunks = list(client.completions.create(model="demo", prompt="Nest:", max_tokens=40, temperature=1.0,
                                                seed=seed, stream=True, extra_body=body))
        assert "".join(ch.choices[0].text for ch in chunks) == r.choices[0].text   # seeded: the same output


def test_grammar_starts_after_the_reasoning_block(client: openai.OpenAI, engine: Engine) -> None:
    """Thinking on: Qwen3's prompt leaves the block to the model, so its first token may be <think>
    (the bias makes this random model open it and, inside, close it at once); the answer after
    </think> is constrained."""
    [start], [end] = (engine.tokenizer.encode(t) for t in ("<think>", "</think>"))
    r = client.chat.completions.create(model="demo", messages=USER, response_format=PERSON_FORMAT, max_tokens=250,
                                       temperature=0, logit_bias={str(start): 100, str(end): 100})
    c = r.choices[0]
    assert c.finish_reason == "stop" and not (c.model_extra.get("reasoning_content") or "").strip()
    check_person(json.loads(c.message.content))


def test_a_model_that_does_not_reason_is_constrained_from_its_first_token(client: openai.OpenAI) -> None:
    """Thinking on, but the model answers at once (as Qwen3 instruct checkpoints do): no free output."""
    r = client.chat.completions.create(model="demo", messages=USER, response_format=PERSON_FORMAT, max_tokens=250,
                                       temperature=0)
    assert r.choices[0].finish_reason == "stop"
    check_person(json.loads(r.choices[0].message.content))


def test_bad_schema_is_a_400_and_serving_goes_on(client: openai.OpenAI) -> None:
    for schema in ({"type": "object", "properties": {"a": {"type": "nope"}}}, {"minimum": "x"}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="demo", messages=USER, max_tokens=5, response_format={
                "type": "json_schema", "json_schema": {"name": "bad", "schema": schema}})
        assert e.value.body["param"] == "response_format"
    r = client.chat.completions.create(model="demo", messages=USER, max_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]


def check_call(name: str, arguments: str) -> None:
    args = json.loads(arguments)
    assert arguments == json.dumps(args, ensure_ascii=False)   # laid out as the chat template writes calls
    if name == "get_weather":
        assert set(args) == {"city", "days"} and isinstance(args["city"], str) and len(args["city"]) <= 8
        assert isinstance(args["days"], int) and 1 <= args["days"] <= 7
    else:
        assert name == "get_time" and args["zone"] in ("UTC", "CET")


def test_a_forced_tool_call_holds_to_the_parameters_schema(client: openai.OpenAI) -> None:
    """tool_choice "required" or a named function: the demo model's random weights write valid calls only because
    the arguments (and, for "required", the names) are constrained; streamed as not. parallel_tool_calls false holds
    "required" to one call (a random model would chain calls until max_tokens cuts one)."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(3):
        for choice in (named, "required"):
            r = client.chat.completions.create(model="demo", messages=USER, tools=TOOLS, tool_choice=choice,
                                               max_tokens=120, temperature=1.0, seed=seed, parallel_tool_calls=False)
            calls = r.choices[0].message.tool_calls
            assert len(calls) == 1 and r.usage.completion_tokens < 120
            assert calls and r.choices[0].finish_reason == ("stop" if choice is named else "tool_calls")
            for call in calls:
                check_call(call.function.name, call.function.arguments)
            assert choice != named or [c.function.name for c in calls] == ["get_weather"]
    chunks = list(client.chat.completions.create(model="demo", messages=USER, tools=TOOLS, tool_choice="required",
                                                 max_tokens=120, temperature=1.0, seed=0, stream=True,
                                                 parallel_tool_calls=False))
    streamed: dict[int, list[str]] = {}
    for d in (d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []):
        streamed.setdefault(d.index, [d.function.name, ""])[1] += d.function.arguments or ""
    assert streamed and all(check_call(name, args) is None for name, args in streamed.values())


def test_a_tool_schema_that_cannot_be_enforced_is_a_400(client: openai.OpenAI) -> None:
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="demo", messages=USER, tools=bad, tool_choice="required", max_tokens=5)
    assert e.value.body["param"] == "tools"


def test_responses_text_format_json_schema(client: openai.OpenAI) -> None:
    """/v1/responses' text.format goes the response_format way: the answer is JSON matching the schema."""
    person = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    r = client.responses.create(model="demo", input=USER[0]["content"], text={"format": person},
                                max_output_tokens=250, temperature=0)
    assert r.status == "completed" and r.text.format.type == "json_schema"
    check_person(json.loads(r.output_text))
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="demo", input="x", max_output_tokens=5, text={"format": {
            "type": "json_schema", "name": "bad", "schema": {"minimum": "x"}}})
    assert e.value.body["param"] == "text.format"


def readme_structured_requests() -> list[dict]:
    """The chat bodies of the README's curl examples that ask for structured output."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    bodies = [json.loads(b) for b in re.findall(r"/v1/chat/completions -H '[^']*' -d '(\{.*?\})'", readme, re.S)]
    return [b for b in bodies if "response_format" in b]


def test_the_readme_s_structured_example_completes_with_the_demo_model(client: openai.OpenAI) -> None:
    """The README's json_schema example, as a new user would run it: JSON that matches its schema (compact, so it
    closes within the example's max_tokens), greedy and sampled."""
    examples = readme_structured_requests()
    assert examples
    for body in examples:
        schema = body["response_format"]["json_schema"]["schema"]
        for seed in (None, 0, 1):
            r = client.chat.completions.create(**{**body, "model": "demo"}, seed=seed, temperature=None if seed is None
                                               else 1.0)
            assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
            value = json.loads(r.choices[0].message.content)
            assert not re.search(r"\s", r.choices[0].message.content)   # compact
            assert sorted(value) == sorted(schema["required"]) == sorted(schema["properties"])
            for key, prop in schema["properties"].items():
                assert isinstance(value[key], int) and prop["minimum"] <= value[key] <= prop["maximum"]
