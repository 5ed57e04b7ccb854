"""The request fields that constrain the output's form, parsed into one structured.OutputGrammar (or
None): OpenAI's `response_format` and vLLM's `structured_outputs`. Every mistake inside either is a 400
naming the field the client used (the message names the exact key)."""
from __future__ import annotations

import json

from openinfer.sampling.structured import OutputGrammar

from .errors import APIError, bad_request
from .fields import Fields


def output_grammar(f: Fields) -> OutputGrammar | None:
    """The grammar the output must match; None for free text."""
    fmt, so = _response_format(f), _structured_outputs(f)
    if fmt is not None and so is not None:
        raise bad_request("Give 'response_format' or 'structured_outputs', not both.", "structured_outputs")
    return fmt or so


def _response_format(f: Fields) -> OutputGrammar | None:
    """{"type": "text" | "json_object" | "json_schema", "json_schema": {name, schema, strict?, description?}}"""
    try:
        rf = f.sub("response_format")
        if rf is None:
            return None
        kind, schema = rf.get("type", "str", required=True), None
        if kind == "json_object":
            schema = {"type": "object"}
        elif kind == "json_schema":
            js = rf.sub("json_schema", required=True)
            js.get("name", "str", required=True)
            js.get("description", "str")
            js.get("strict", "bool")
            schema = js.get("schema", "object", required=True)
            js.finish()
        elif kind != "text":
            raise bad_request(f"'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"; "
                              f"got {kind!r}.", "response_format")
        rf.finish()
    except APIError as e:
        raise bad_request(e.message, "response_format", e.code) from None
    return None if schema is None else OutputGrammar("json", schema)


def _structured_outputs(f: Fields) -> OutputGrammar | None:
    """vLLM's {"json": schema (an object or its JSON text) | "regex": pattern | "choice": [str, ...] |
    "grammar": Lark or GBNF text | "json_object": true}, exactly one; its other keys (structural_tag,
    whitespace options) are 400s."""
    param = "structured_outputs"
    try:
        so = f.sub(param)
        if so is None:
            return None
        found = []
        if (schema := so.take("json")) is not None:
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError:
                    raise bad_request("'structured_outputs.json' is not valid JSON.", param) from None
            if not isinstance(schema, dict):
                raise bad_request("'structured_outputs.json' must be a JSON Schema object.", param)
            found.append(OutputGrammar("json", schema, param))
        if (pattern := so.get("regex", "str")) is not None:
            found.append(OutputGrammar("regex", pattern, param))
        if (choice := so.get("choice", "list")) is not None:
            if not choice or not all(isinstance(c, str) and c for c in choice):
                raise bad_request("'structured_outputs.choice' must be a non-empty array of non-empty strings.", param)
            found.append(OutputGrammar("choice", choice, param))
        if (grammar := so.get("grammar", "str")) is not None:
            if not grammar.strip():
                raise bad_request("'structured_outputs.grammar' is empty.", param)
            found.append(OutputGrammar("grammar", grammar, param))
        if so.get("json_object", "bool"):
            found.append(OutputGrammar("json", {"type": "object"}, param))
        so.finish()
        if len(found) != 1:
            raise bad_request("'structured_outputs' takes exactly one of json, regex, choice, grammar and "
                              "json_object.", param)
    except APIError as e:
        raise bad_request(e.message, param, e.code) from None
    return found[0]
