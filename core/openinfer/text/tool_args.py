"""Tool-call arguments written as text (XML-style formats: Qwen3.5's `<parameter=…>`, GLM's `<arg_value>`):
the JSON types each parameter's schema allows, a value's text converted to the first of them it parses as,
and assistant tool calls with their JSON-text arguments turned back into objects for chat templates that
iterate over them."""
from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from .tokenizer import ChatTemplateError

_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def schema_types(schema: Any) -> list[str]:
    """The JSON types a parameter schema allows, in order (type, type lists, anyOf/oneOf)."""
    if not isinstance(schema, dict):
        return []
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [x for sub in schema[key] for x in schema_types(sub)]
    return []


def structured_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:  # the template renders nested values with tojson, but models also write Python literals
        return json.loads(json.dumps(ast.literal_eval(text)))  # tuples become lists; sets, bytes fail
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def convert_value(value: str, types: list[str]) -> Any:
    """A parameter's text as the first of `types` it parses as; the text itself if none fits."""
    text = value.strip()
    for t in types:
        if t == "string":
            return value
        if t == "null" and text in ("null", "None"):
            return None
        if t == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if t == "integer" and _INT.fullmatch(text):
            return int(text)
        if t == "number" and _FLOAT.fullmatch(text):
            if _INT.fullmatch(text):
                return int(text)
            if math.isfinite(number := float(text)):
                return number
        if t in ("object", "array") and isinstance(v := structured_value(text), dict if t == "object" else list):
            return v
    return value


def param_types(tools: list[dict]) -> dict[str, dict[str, list[str]]]:
    """function name -> parameter name -> allowed JSON types, from the request's tools."""
    out: dict[str, dict[str, list[str]]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        props = (fn.get("parameters") or {}).get("properties") if isinstance(fn.get("parameters"), dict) else None
        out[fn["name"]] = {k: schema_types(v) for k, v in props.items()} if isinstance(props, dict) else {}
    return out


def is_text(types: list[str]) -> bool:
    # Streamed as a JSON string as it arrives: declared string (or nullable string), or untyped.
    return not [t for t in types if t != "null"] or set(types) <= {"string", "null"}



def with_object_arguments(message: dict) -> dict:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list):
        return message
    fixed = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                args = json.loads(fn["arguments"] or "{}")
            except ValueError:
                args = None
            if not isinstance(args, dict):
                raise ChatTemplateError(f"tool call arguments must be a JSON object, got {fn['arguments']!r}")
            call = {**call, "function": {**fn, "arguments": args}}
        fixed.append(call)
    return {**message, "tool_calls": fixed}
