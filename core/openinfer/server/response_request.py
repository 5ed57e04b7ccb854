"""POST /v1/responses request parsing: OpenAI's Responses fields read into a chat request (protocol.ChatRequest),
so the prompt, reasoning and tool calls go the chat endpoint's way.

`input` is a string (one user message) or a list of items: messages (role user, system, developer or assistant;
text content or input_text / output_text parts), function_call and function_call_output items (an assistant
message with tool_calls and `tool` messages, as a chat client sends them), and reasoning items, accepted and left
out of the prompt (chat templates drop past turns' reasoning). `instructions` is a system message placed first.
Tools come in the Responses' flat form ({"type": "function", "name", …}); a built-in tool is a 400 naming `tools`.
`parallel_tool_calls` false keeps the first call only. `text.format` json_object / json_schema constrains the
answer as chat's response_format does. vLLM's `chat_template_kwargs` work as on chat (Qwen3's enable_thinking);
`reasoning.effort` none or minimal turns thinking off (the other efforts leave it on; a line that does not reason
takes "none" only), `reasoning.summary` is accepted and writes none. `background` (with `store`, without `stream`)
answers at once with a queued response that GET /v1/responses/{id} follows and POST /v1/responses/{id}/cancel stops. Anything else unknown (e.g.
`top_logprobs`) is a 400 naming it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openinfer.sampling.structured import OutputGrammar

from .errors import bad_request
from .fields import IGNORED, Fields, is_kind
from .protocol import ChatRequest, Generation, parse_tools, template_kwargs, template_message

INPUT_ROLES = ("user", "system", "developer", "assistant")
SUMMARIES = ("auto", "concise", "detailed")
_TEXT_PARTS = ("input_text", "output_text")
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512   # OpenAI's bounds


@dataclass
class ResponsesRequest:
    chat: ChatRequest            # its messages are the conversation's (conversation_messages), set by the endpoint
    items: list[dict[str, Any]]  # this request's input items, validated
    instructions: str | None
    previous_response_id: str | None
    store: bool
    background: bool             # answer at once; the response is generated on, to be polled
    echo: dict[str, Any]         # the request's settings as the response object repeats them


def parse_responses(body: dict[str, Any]) -> ResponsesRequest:
    f = Fields(body)
    gen = Generation(model=f.get("model", "str", required=True), stream=f.get("stream", "bool", False),
                     max_tokens=f.get("max_output_tokens", "int"), max_tokens_param="max_output_tokens")
    for key in ("temperature", "top_p"):
        if (value := f.get(key, "number")) is not None:
            gen.sampling[key] = float(value)
    if (text := _text_format(f)) is not None:
        gen.grammar = OutputGrammar("json", text.get("schema", {"type": "object"}), "text.format")
    items = input_items(f)
    tools = f.get("tools", "list") or []
    choice = f.get("tool_choice", "object" if isinstance(body.get("tool_choice"), dict) else "str")
    chat_tools, forced = parse_tools(Fields({"tools": [_chat_tool(t, i) for i, t in enumerate(tools)] or None,
                                             "tool_choice": _chat_tool_choice(choice)}))
    chat = ChatRequest(gen, [], chat_tools, template_kwargs(f), tool_required=forced is not None,
                       tool_name=forced or None)
    metadata = _metadata(f)
    reasoning = _reasoning(f)
    chat.effort(reasoning["effort"], "reasoning.effort")
    chat.parallel_tool_calls = f.get("parallel_tool_calls", "bool", True)
    echo = {"max_output_tokens": gen.max_tokens, "tools": tools, "tool_choice": choice or "auto",
            "parallel_tool_calls": chat.parallel_tool_calls, "metadata": metadata or {},
            "text": {"format": text or {"type": "text"}}, "reasoning": reasoning}
    store, background = f.get("store", "bool", True), f.get("background", "bool", False)
    if background and not store:
        raise bad_request("'background' needs 'store': a background response is read back by its id.", "background")
    if background and gen.stream:
        raise bad_request("'background' with 'stream' is not supported: poll GET /v1/responses/{id} instead.",
                          "background")
    echo["background"] = background
    req = ResponsesRequest(chat, items, f.get("instructions", "str"), f.get("previous_response_id", "str"), store,
                           background, echo)
    f.only("truncation", "disabled")
    f.only("include", [])
    f.finish(IGNORED)
    return req


def _metadata(f: Fields) -> dict[str, str] | None:
    """`metadata` within OpenAI's bounds (it is stored with the response): up to 16 pairs, keys up to 64
    characters, string values up to 512."""
    metadata = f.get("metadata", "object")
    if metadata is None:
        return None
    if not all(isinstance(v, str) for v in metadata.values()):
        raise bad_request("'metadata' must map keys to strings.", "metadata", "invalid_type")
    if len(metadata) > METADATA_PAIRS or any(len(k) > METADATA_KEY or len(v) > METADATA_VALUE
                                             for k, v in metadata.items()):
        raise bad_request(f"'metadata' holds at most {METADATA_PAIRS} pairs, keys of up to {METADATA_KEY} "
                          f"characters and values of up to {METADATA_VALUE}.", "metadata")
    return metadata


def _reasoning(f: Fields) -> dict[str, str | None]:
    """`reasoning` {effort, summary} as the response repeats it. The Qwen lines think or not (enable_thinking), so
    effort none / minimal turns thinking off and the others leave it on; summary is accepted (clients such as Codex
    send "auto") and none is written: the whole reasoning is in the reasoning item's content."""
    r = f.sub("reasoning") or Fields({}, "reasoning")
    effort, summary = r.get("effort", "str"), r.get("summary", "str")
    if summary is not None and summary not in SUMMARIES:
        raise bad_request(f"'reasoning.summary' must be one of {', '.join(SUMMARIES)}.", "reasoning.summary")
    r.finish()
    return {"effort": effort, "summary": summary}


def _text_format(f: Fields) -> dict[str, Any] | None:
    """text.format as given when it asks for JSON ({"type": "json_object"} or {"type": "json_schema", "name",
    "schema", "strict"?, "description"?}); None for plain text."""
    text = f.sub("text")
    if text is None:
        return None
    fmt = text.sub("format")
    text.only("verbosity", "medium")
    text.finish()
    if fmt is None:
        return None
    kind = fmt.get("type", "str", required=True)
    if kind == "json_schema":
        fmt.get("name", "str", required=True)
        fmt.get("description", "str")
        fmt.get("strict", "bool")
        fmt.get("schema", "object", required=True)
    elif kind not in ("text", "json_object"):
        raise bad_request(f"'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"; got {kind!r}.",
                          "text.format.type")
    fmt.finish()
    return None if kind == "text" else fmt.data


def _chat_tool(tool: Any, i: int) -> dict[str, Any]:
    """A flat Responses function tool in the chat form the template and the tool parser read."""
    name = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise bad_request(f"'{name}' must be an object.", name, "invalid_type")
    t = Fields(tool, name)
    if (kind := t.get("type", "str", required=True)) != "function":
        raise bad_request(f"Tool type {kind!r} is not supported by this server: only \"function\" tools.", "tools",
                          "unsupported_parameter")
    fn = {"name": t.get("name", "str", required=True)}
    for key, kind in (("description", "str"), ("parameters", "object"), ("strict", "bool")):
        if (value := t.get(key, kind)) is not None:
            fn[key] = value
    t.finish()
    return {"type": "function", "function": fn}


def _chat_tool_choice(choice: str | dict | None) -> str | dict | None:
    """tool_choice in chat's form: the Responses' named choice is {"type": "function", "name": …}."""
    if not isinstance(choice, dict):
        return choice
    if not (choice.get("type") == "function" and isinstance(choice.get("name"), str) and len(choice) == 2):
        raise bad_request("A 'tool_choice' object must be {\"type\": \"function\", \"name\": …}.", "tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def input_items(f: Fields) -> list[dict[str, Any]]:
    """`input` as a list of validated items (a string is one user message)."""
    raw = f.get("input", "str" if isinstance(f.data.get("input"), str) else "list", required=True)
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    if not raw:
        raise bad_request("'input' must not be empty.", "input")
    return [_item(item, f"input[{i}]") for i, item in enumerate(raw)]


def _item(raw: Any, name: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise bad_request(f"'{name}' must be an object.", name, "invalid_type")
    f = Fields(raw, name)
    kind = f.get("type", "str", "message")
    f.get("id", "str")
    f.get("status", "str")
    if kind == "message":
        role = f.get("role", "str", required=True)
        if role not in INPUT_ROLES:
            raise bad_request(f"'{name}.role' must be one of {', '.join(INPUT_ROLES)}; got {role!r}.", f"{name}.role")
        _text(f, "content")
    elif kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            f.get(key, "str", required=True)
    elif kind == "function_call_output":
        f.get("call_id", "str", required=True)
        _text(f, "output")
    elif kind == "reasoning":
        f.get("summary", "list")
        f.get("content", "list")
        f.get("encrypted_content", "str")
    else:
        raise bad_request(f"'{name}.type' {kind!r} is not supported: use message, function_call, "
                          "function_call_output or reasoning items.", f"{name}.type")
    f.finish()
    return {**raw, "type": kind}


def _text(f: Fields, key: str) -> None:
    """A required string, or a list of text parts (input_text / output_text)."""
    value = f.get(key, "list" if isinstance(f.data.get(key), list) else "str", required=True)
    for j, part in enumerate(value if isinstance(value, list) else []):
        name = f"{f.name(key)}[{j}]"
        if not (isinstance(part, dict) and part.get("type") in _TEXT_PARTS and is_kind(part.get("text"), "str")):
            raise bad_request(f"'{name}': only input_text and output_text parts are supported.", name)
        p = Fields(part, name)
        for k, kind in (("type", "str"), ("text", "str"), ("annotations", "list"), ("logprobs", "list")):
            p.get(k, kind)
        p.finish()


def _content(value: str | list[dict[str, Any]]) -> str | list[dict[str, str]]:
    """Text, or text parts in chat's form."""
    return value if isinstance(value, str) else [{"type": "text", "text": p["text"]} for p in value]


def conversation_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of a conversation's items, as a chat client would send them: function calls join the
    assistant message before them (or make one), each call's output is a `tool` message."""
    messages: list[dict[str, Any]] = [] if instructions is None else [{"role": "system", "content": instructions}]
    for item in items:
        if item["type"] == "message":
            messages.append(template_message({"role": item["role"], "content": _content(item["content"])}))
        elif item["type"] == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if not (messages and messages[-1]["role"] == "assistant"):
                messages.append({"role": "assistant", "content": ""})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif item["type"] == "function_call_output":
            output = item["output"]
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": output if isinstance(output, str) else "".join(p["text"] for p in output)})
    return messages
