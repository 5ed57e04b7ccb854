"""POST /v1/responses and GET /v1/responses/{id} driven by the official `openai` client (fake engine, scripted
outputs): prompts built as chat builds them, output items, usage, incomplete, tool calls over two turns, stored
conversations, streaming, the engine's sampling defaults, and 400s naming the field."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from fake_engine import FakeEngine
from openinfer.server.errors import APIError
from openinfer.server.responses import ResponseStore
from server_harness import post, wait_until

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
QUESTION = "What is the weather in Paris?"
CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>')
HELLO = "Hello from the fake engine."


def prompt_text(fake: FakeEngine) -> str:
    return fake.tokenizer.decode(fake.submitted[-1][1], False)


def chat_prompt_ids(client: openai.OpenAI, fake: FakeEngine, messages: list[dict], **kw) -> list[int]:
    """The prompt the chat endpoint builds for the same conversation."""
    client.chat.completions.create(model="fake", messages=messages, **kw)
    return fake.submitted[-1][1]


def test_string_input_instructions_and_usage(client: openai.OpenAI, fake: FakeEngine) -> None:
    r = client.responses.create(model="fake", input="hi", instructions="Be brief.")
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "fake"
    assert (r.status, r.incomplete_details, r.error, r.output_text) == ("completed", None, None, HELLO)
    [item] = r.output
    assert (item.type, item.role, item.status, item.id[:4]) == ("message", "assistant", "completed", "msg_")
    assert [(c.type, c.annotations) for c in item.content] == [("output_text", [])]
    rid, prompt, params = fake.submitted[-1]
    assert rid.startswith("resp-")
    assert prompt_text(fake) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n" \
                                "<|im_start|>assistant\n"
    assert params.max_tokens == fake.max_model_len - len(prompt)   # absent: fill the context, as chat does
    u = r.usage
    assert u.input_tokens == len(prompt) and u.output_tokens == len(fake.tokenizer.encode(HELLO)) + 1   # + eos
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.output_tokens_details.reasoning_tokens == 0
    assert 0 <= u.input_tokens_details.cached_tokens < u.input_tokens
    assert (r.instructions, r.tools, r.tool_choice, r.parallel_tool_calls, r.store, r.metadata) == \
        ("Be brief.", [], "auto", True, True, {})


def test_message_items_render_as_the_equivalent_chat_request(client: openai.OpenAI, fake: FakeEngine) -> None:
    r = client.responses.create(model="fake", instructions="Be brief.", input=[
        {"role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "part one"},
                                                         {"type": "input_text", "text": "part two"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Oui.", "annotations": []}]},
        {"role": "user", "content": "Again?"}], metadata={"k": "v"}, user="u1")
    assert r.output_text == HELLO and r.metadata == {"k": "v"}
    ids = fake.submitted[-1][1]
    assert ids == chat_prompt_ids(client, fake, [
        {"role": "system", "content": "Be brief."}, {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": "Oui."}, {"role": "user", "content": "Again?"}])
    assert "part one\npart two" in fake.tokenizer.decode(ids, False)


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI, fake: FakeEngine) -> None:
    r = client.responses.create(model="fake", input="hi", max_output_tokens=3)
    assert (r.status, r.incomplete_details.reason, r.max_output_tokens) == ("incomplete", "max_output_tokens", 3)
    assert r.output_text == "Hello from the" and r.output[0].status == "incomplete"
    assert fake.submitted[-1][2].max_tokens == 3 and r.usage.output_tokens == 3


def test_reasoning_item(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say("<think>\nTwo plus two.\n</think>\n\nIt is 4.")
    r = client.responses.create(model="fake", input="2+2?")
    reasoning, message = r.output
    assert (reasoning.type, reasoning.id[:3], reasoning.summary) == ("reasoning", "rs_", [])
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", "Two plus two.")]
    assert message.type == "message" and r.output_text == "It is 4."
    assert r.usage.output_tokens_details.reasoning_tokens == len(fake.tokenizer.encode("Two plus two."))


def test_function_calls_then_their_outputs(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say(CALLS)
    r = client.responses.create(model="fake", input=QUESTION, tools=TOOLS)
    assert [(c.type, c.name, json.loads(c.arguments), c.status) for c in r.output] == [
        ("function_call", "get_weather", {"city": "Paris"}, "completed"),
        ("function_call", "get_weather", {"city": "Lyon"}, "completed")]
    assert all(c.id.startswith("fc_") and c.call_id.startswith("call_") for c in r.output)
    assert r.output_text == "" and r.tools[0].name == "get_weather"
    first_prompt = fake.submitted[-1][1]
    assert first_prompt == chat_prompt_ids(client, fake, [{"role": "user", "content": QUESTION}], tools=CHAT_TOOLS)
    # the next turn sends the calls back with their outputs, as the SDK dumps them
    fake.say("Sunny in both.")
    turn = [{"role": "user", "content": QUESTION}, *(c.model_dump(exclude_none=True) for c in r.output),
            *({"type": "function_call_output", "call_id": c.call_id, "output": "sunny"} for c in r.output)]
    r2 = client.responses.create(model="fake", input=turn, tools=TOOLS)
    assert r2.output_text == "Sunny in both."
    ids = fake.submitted[-1][1]
    calls = [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for c in r.output]
    assert ids == chat_prompt_ids(client, fake, [
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": c.call_id, "content": "sunny"} for c in r.output)], tools=CHAT_TOOLS)
    assert "<tool_response>\nsunny" in fake.tokenizer.decode(ids, False)


def test_tool_choice_named_none_and_parallel_tool_calls(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say('{"city": "Oslo"}}\n</tool_call>')
    r = client.responses.create(model="fake", input=QUESTION, tools=TOOLS,
                                tool_choice={"type": "function", "name": "get_weather"})
    assert [(c.name, json.loads(c.arguments)) for c in r.output] == [("get_weather", {"city": "Oslo"})]
    assert prompt_text(fake).endswith('<tool_call>\n{"name": "get_weather", "arguments": ')
    assert r.tool_choice.name == "get_weather"
    fake.say(CALLS)
    r = client.responses.create(model="fake", input=QUESTION, tools=TOOLS, parallel_tool_calls=False)
    assert [json.loads(c.arguments) for c in r.output] == [{"city": "Paris"}] and r.parallel_tool_calls is False
    r = client.responses.create(model="fake", input=QUESTION, tools=TOOLS, tool_choice="none")
    assert r.output[0].type == "message" and "<tool_call>" in r.output_text
    assert "get_weather" not in prompt_text(fake)


def test_previous_response_id_continues_the_stored_conversation(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say("Hi Ann.")
    r1 = client.responses.create(model="fake", input="My name is Ann.", instructions="Old rules.")
    fake.say("Ann.")
    r2 = client.responses.create(model="fake", input="What is my name?", previous_response_id=r1.id,
                                 instructions="New rules.")
    assert r2.previous_response_id == r1.id and r2.output_text == "Ann."
    assert fake.submitted[-1][1] == chat_prompt_ids(client, fake, [
        {"role": "system", "content": "New rules."}, {"role": "user", "content": "My name is Ann."},
        {"role": "assistant", "content": "Hi Ann."}, {"role": "user", "content": "What is my name?"}])
    client.responses.create(model="fake", input="And now?", previous_response_id=r2.id)
    text = prompt_text(fake)
    assert "Old rules" not in text and text.count("Ann.") == 3   # the whole chain, instructions not carried
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="fake", input="x", previous_response_id="resp_unknown")
    assert e.value.body["param"] == "previous_response_id" and e.value.status_code == 404


def test_retrieve_and_store_false(client: openai.OpenAI, http: httpx.Client) -> None:
    r = client.responses.create(model="fake", input="hi")
    assert client.responses.retrieve(r.id).model_dump() == r.model_dump()
    kept = client.responses.create(model="fake", input="hi", store=False)
    assert kept.store is False
    for rid in (kept.id, "resp_nope"):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(rid)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="fake", input="x", previous_response_id=kept.id)
    res = http.get(f"/v1/responses/{r.id}", params={"stream": "true"})
    assert res.status_code == 400 and res.json()["error"]["param"] == "stream"


def test_delete_forgets_a_stored_response(client: openai.OpenAI, http: httpx.Client) -> None:
    r = client.responses.create(model="fake", input="hi")
    res = http.delete(f"/v1/responses/{r.id}")
    assert res.status_code == 200 and res.json() == {"id": r.id, "object": "response.deleted", "deleted": True}
    for call in (lambda: client.responses.retrieve(r.id), lambda: client.responses.delete(r.id),
                 lambda: client.responses.create(model="fake", input="x", previous_response_id=r.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    kept = client.responses.create(model="fake", input="hi")
    assert client.responses.delete(kept.id) is None   # the SDK's form of the call


def test_input_items_list_the_conversation_before_a_response(client: openai.OpenAI, http: httpx.Client,
                                                             fake: FakeEngine) -> None:
    fake.say("Hi Ann.")
    r1 = client.responses.create(model="fake", input="My name is Ann.", instructions="Be brief.")
    r2 = client.responses.create(model="fake", previous_response_id=r1.id, input=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is my name?"}]}])
    items = client.responses.input_items.list(r2.id).data   # newest first, OpenAI's default
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant"), ("message", "user")]
    assert [i.content[0].text for i in items] == ["What is my name?", "Hi Ann.", "My name is Ann."]
    assert [i.content[0].type for i in items] == ["input_text", "output_text", "input_text"]
    assert items[1].id == r1.output[0].id and len({i.id for i in items}) == 3
    again = client.responses.input_items.list(r2.id).data
    assert [i.id for i in again] == [i.id for i in items]   # ids given once, at creation
    paged = list(client.responses.input_items.list(r2.id, limit=1, order="asc"))   # the SDK follows `after`
    assert [i.id for i in paged] == [i.id for i in reversed(items)]
    first = http.get(f"/v1/responses/{r2.id}/input_items", params={"limit": 2, "order": "asc"}).json()
    assert (first["first_id"], first["last_id"], first["has_more"]) == (items[2].id, items[1].id, True)
    assert [i.id for i in client.responses.input_items.list(r1.id).data] == [items[2].id]
    for params, param in (({"limit": 0}, "limit"), ({"limit": "x"}, "limit"), ({"order": "up"}, "order"),
                          ({"after": "msg_nope"}, "after"), ({"include": "message.input_image.image_url"}, "include")):
        res = http.get(f"/v1/responses/{r2.id}/input_items", params=params)
        assert res.status_code == 400 and res.json()["error"]["param"] == param, params
    assert http.get("/v1/responses/resp_nope/input_items").status_code == 404


def test_background_response_is_polled_to_completion(client: openai.OpenAI, http: httpx.Client,
                                                     fake: FakeEngine) -> None:
    fake.say("Done in the background.")
    fake.paused = True   # the engine holds the request: the response is seen queued
    r = client.responses.create(model="fake", input="Work on it.", background=True)
    assert r.status == "queued" and r.background is True and r.output == []
    assert client.responses.retrieve(r.id).status == "queued"
    res = http.post("/v1/responses", json={"model": "fake", "input": "next", "previous_response_id": r.id})
    assert res.status_code == 400 and res.json()["error"]["param"] == "previous_response_id"
    fake.paused = False
    assert wait_until(lambda: client.responses.retrieve(r.id).status == "completed")
    done = client.responses.retrieve(r.id)
    assert done.output_text == "Done in the background." and done.usage.output_tokens > 0
    with pytest.raises(openai.BadRequestError):   # only one in progress can be cancelled
        client.responses.cancel(r.id)
    follow = client.responses.create(model="fake", input="And?", previous_response_id=r.id)
    assert follow.status == "completed"


def test_background_response_failing_mid_generation_is_failed(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say("Working", eos=False)   # then filler up to the limit: ~2 s at a step of 2 ms, killed well before
    fake.step_s = 0.002
    r = client.responses.create(model="fake", input="x", max_output_tokens=1000, background=True)
    try:
        assert wait_until(lambda: client.responses.retrieve(r.id).status == "in_progress")
        fake.kill("boom")
        assert wait_until(lambda: client.responses.retrieve(r.id).status == "failed")
    finally:
        fake.dead_reason = None
    failed = client.responses.retrieve(r.id)
    assert (failed.error.code, failed.error.message) == ("engine_error", "engine died: boom")


def test_background_response_refused_by_the_engine_is_a_400(http: httpx.Client, fake: FakeEngine) -> None:
    fake.kv_tokens = 8   # the engine refuses it at submit: the client hears at once, not from a poll
    try:
        res = http.post("/v1/responses", json={"model": "fake", "input": "hi there", "background": True})
    finally:
        fake.kv_tokens = 1 << 20
    assert res.status_code == 400 and res.json()["error"]["param"] == "max_output_tokens"


def test_cancel_stops_a_background_response(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.paused = True
    r = client.responses.create(model="fake", input="Long task.", background=True)
    cancelled = client.responses.cancel(r.id)
    assert cancelled.status == "cancelled" and client.responses.retrieve(r.id).status == "cancelled"
    assert wait_until(lambda: any(rid.startswith("resp-") for rid in fake.aborted))   # its engine request
    assert wait_until(lambda: fake.stats().num_running == 0)
    fake.paused = False
    assert client.responses.retrieve(r.id).status == "cancelled"   # stays so once the engine lets go
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(r.id)
    plain = client.responses.create(model="fake", input="hi")
    with pytest.raises(openai.BadRequestError):   # not a background response
        client.responses.cancel(plain.id)
    fake.paused = True
    gone = client.responses.create(model="fake", input="Another.", background=True)
    client.responses.delete(gone.id)   # deleting a running one cancels it
    assert wait_until(lambda: fake.stats().num_running == 0)
    fake.paused = False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(gone.id)


def test_stream_events_build_the_same_response(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say("<think>\nHmm.\n</think>\n\nIt is 4.")
    plain = client.responses.create(model="fake", input="2+2?")
    events = list(client.responses.create(model="fake", input="2+2?", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    item_events = ["response.output_item.added", "response.content_part.added"]
    assert kinds[:4] == ["response.created", "response.in_progress", *item_events]
    assert kinds[-1] == "response.completed" and kinds.count("response.output_item.done") == 2
    reasoning = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    text = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(text) > 1 and "".join(text) == plain.output_text and "".join(reasoning) == "Hmm."
    done = [e.type for e in events[kinds.index("response.output_text.done"):]]
    assert done == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                    "response.completed"]
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [(i.type, i.content) for i in added] == [("reasoning", []), ("message", [])]   # parts come after
    final = events[-1].response
    assert [i.type for i in final.output] == ["reasoning", "message"] and final.output_text == plain.output_text
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert client.responses.retrieve(final.id).output_text == "It is 4."   # stored once done


def test_stream_through_the_sdk_accumulator(client: openai.OpenAI, fake: FakeEngine) -> None:
    """responses.stream() checks each event against what came before (items added before their deltas, ids)."""
    fake.say(CALLS)
    with client.responses.stream(model="fake", input=QUESTION, tools=TOOLS) as s:
        args = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
        final = s.get_final_response()
    assert [json.loads(c.arguments) for c in final.output] == [{"city": "Paris"}, {"city": "Lyon"}]
    assert args == "".join(c.arguments for c in final.output)
    fake.say(HELLO)
    with client.responses.stream(model="fake", input="hi", max_output_tokens=2) as s:
        events = list(s)   # OpenAI ends a cut response with response.incomplete (get_final_response wants completed)
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"
    assert events[-1].response.output_text == "Hello from"


def test_raw_stream_names_each_event(http: httpx.Client) -> None:
    text = http.post("/v1/responses", json={"model": "fake", "input": "hi", "stream": True}).text
    blocks = [b.split("\n") for b in text.strip().split("\n\n")]
    assert all(b[0] == f"event: {json.loads(b[1].removeprefix('data: '))['type']}" for b in blocks)
    assert "[DONE]" not in text


def test_generation_config_defaults_apply(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.sampling_defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    try:
        r = client.responses.create(model="fake", input="hi")
        p = fake.submitted[-1][2]
        assert (p.temperature, p.top_p, p.top_k) == (0.6, 0.95, 20) and (r.temperature, r.top_p) == (0.6, 0.95)
        r = client.responses.create(model="fake", input="hi", temperature=0.2)
        assert (fake.submitted[-1][2].temperature, fake.submitted[-1][2].top_p, r.temperature) == (0.2, 0.95, 0.2)
    finally:
        fake.sampling_defaults = {}


@pytest.mark.parametrize("extra, param", [
    ({"frobnicate": 1}, "frobnicate"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"reasoning": {"summary": "long"}}, "reasoning.summary"),
    ({"reasoning": {"generate_summary": "auto"}}, "reasoning.generate_summary"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"background": True, "store": False}, "background"),
    ({"background": True, "stream": True}, "background"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"input": None}, "input"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": ["hi"]}, "input[0]"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": "x", "bogus": 1}]}, "input[0].bogus"),
    ({"input": [{"type": "image", "url": "x"}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
])
def test_bad_requests_are_400s_naming_the_field(http: httpx.Client, extra: dict, param: str) -> None:
    r = http.post("/v1/responses", json={"model": "fake", "input": "hi", **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert http.post("/v1/responses", json={"model": "fake", "input": "hi"}).status_code == 200


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_aborts_the_engine_request(server: str, fake: FakeEngine, stream: bool) -> None:
    fake.step_s = 0.005
    sock = post(server, "/v1/responses", {"model": "fake", "input": "hi", "max_output_tokens": 3000,
                                          "stream": stream})
    assert wait_until(lambda: len(fake.submitted) == 1 and fake.stats().num_running == 1)
    if stream:
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.close()
    assert wait_until(lambda: fake.aborted == [fake.submitted[0][0]])
    assert wait_until(lambda: fake.stats().num_running == 0)


def test_the_store_keeps_the_most_recent() -> None:
    store = ResponseStore(capacity=2)
    for i in range(3):
        store.put({"id": f"resp_{i}"}, [], 0, "")
    assert [store.get(f"resp_{i}", "").body["id"] for i in (1, 2)] == ["resp_1", "resp_2"]
    with pytest.raises(APIError) as e:
        store.get("resp_0", "", "previous_response_id")
    assert (e.value.status, e.value.param) == (404, "previous_response_id")


def test_the_store_keeps_within_its_bytes_and_each_tenant_sees_its_own() -> None:
    item = [{"type": "message", "role": "user", "content": "x" * 1000}]
    store = ResponseStore(capacity=100, max_bytes=2500)
    for i in range(3):
        store.put({"id": f"resp_{i}"}, item, 1, "tenant-a")
    assert store.bytes <= 2500
    with pytest.raises(APIError):
        store.get("resp_0", "tenant-a")   # the oldest went first
    assert store.get("resp_2", "tenant-a").inputs == 1
    for other in ("tenant-b", ""):
        with pytest.raises(APIError) as e:
            store.get("resp_2", other)
        assert e.value.status == 404
        with pytest.raises(APIError):
            store.delete("resp_2", other)
    store.delete("resp_2", "tenant-a")
    assert store.bytes == store.get("resp_1", "tenant-a").size


def test_chat_template_kwargs_switch_thinking_off(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say("Plain.")
    client.responses.create(model="fake", input="hi")
    thinking = prompt_text(fake)
    client.responses.create(model="fake", input="hi", extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert "<think>" not in thinking and prompt_text(fake).endswith("<think>\n\n</think>\n\n")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="fake", input="hi", extra_body={"chat_template_kwargs": {"tools": []}})
    assert e.value.body["param"] == "chat_template_kwargs.tools"


def test_reasoning_effort_switches_thinking_and_is_echoed(client: openai.OpenAI, fake: FakeEngine) -> None:
    fake.say("Plain.")
    r = client.responses.create(model="fake", input="hi", reasoning={"effort": "high", "summary": "auto"})
    assert "<think>" not in prompt_text(fake) and (r.reasoning.effort, r.reasoning.summary) == ("high", "auto")
    for effort in ("none", "minimal"):
        r = client.responses.create(model="fake", input="hi", reasoning={"effort": effort})
        assert prompt_text(fake).endswith("<think>\n\n</think>\n\n") and r.reasoning.effort == effort
    # an explicit template switch wins over the effort
    client.responses.create(model="fake", input="hi", reasoning={"effort": "minimal"},
                            extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert "<think>" not in prompt_text(fake)
    assert client.responses.create(model="fake", input="hi").reasoning.effort is None
