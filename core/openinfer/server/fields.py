"""Typed, named reads of a JSON request object, so every mistake is a 400 naming its field.

A `Fields` remembers which keys were read; `finish()` rejects whatever is left, so a parameter is
either honoured (read) or refused by name, never silently dropped. JSON null means "absent"
(as OpenAI's optional fields allow), so an unknown key set to null is not an error.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .errors import bad_request

# OpenAI metadata that never changes the output: accepted and ignored.
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"})

_KINDS: dict[str, tuple[type, ...]] = {
    "bool": (bool,), "int": (int,), "number": (int, float), "str": (str,), "list": (list,), "object": (dict,)}
_NAMES = {"bool": "a boolean", "int": "an integer", "number": "a number", "str": "a string", "list": "an array",
          "object": "an object"}


def is_kind(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind != "bool":  # JSON true is not the number 1
        return False
    return isinstance(value, _KINDS[kind])


def token_ids(values: list) -> bool:
    """Every value a JSON integer (bools are not), checked at C speed: a prompt of token ids can
    be 10^5 long, and a per-item Python check cost ~3 ms per 16k ids on the time to first token."""
    return set(map(type, values)) <= {int}


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, nested at most MAX_DEPTH deep, every string valid Unicode (JSON's \\u escapes can
    spell a lone UTF-16 surrogate, which no UTF-8 text holds: it would fail the tokenizer or the response later)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"The request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise _too_deep() from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    _check_tree(body, check_text=_SURROGATE_ESCAPE.search(raw) is not None)
    return body


MAX_DEPTH = 64   # far beyond any request's real nesting (tool schemas included); deeper is an attack on recursion
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")   # only such a body can hold a lone surrogate
_SCALARS = frozenset({int, float, str, bool, type(None)})


def _too_deep() -> Exception:
    return bad_request(f"The request body is nested more than {MAX_DEPTH} levels deep.", code="invalid_json")


def _check_tree(body: dict[str, Any], check_text: bool) -> None:
    """Depth, and (check_text) lone surrogates, walked without recursion; flat arrays (token ids) at C speed."""
    todo: list[tuple[Any, str, int]] = [(body, "", 1)]
    while todo:
        node, path, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise _too_deep()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        if not check_text and isinstance(node, list) and set(map(type, node)) <= _SCALARS:
            continue
        for key, value in items:
            name = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
            if check_text and not (_valid_text(key) and (not isinstance(value, str) or _valid_text(value))):
                shown = name.encode("utf-8", "replace").decode()
                raise bad_request(f"'{shown}' holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
                                  "which is not text.", shown, "invalid_value")
            if isinstance(value, (dict, list)):
                todo.append((value, name, depth + 1))


def _valid_text(value: Any) -> bool:
    if not isinstance(value, str):
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


class Fields:
    def __init__(self, data: dict[str, Any], prefix: str = "") -> None:
        self.data = data
        self.prefix = prefix
        self._read: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def take(self, key: str) -> Any:
        """The raw value, marking the key as handled."""
        self._read.add(key)
        return self.data.get(key)

    def get(self, key: str, kind: str, default: Any = None, required: bool = False) -> Any:
        value = self.take(key)
        if value is None:
            if required:
                raise bad_request(f"'{self.name(key)}' is a required property.", self.name(key), "missing_required")
            return default
        if not is_kind(value, kind):
            raise bad_request(f"'{self.name(key)}' must be {_NAMES[kind]}, got {json.dumps(value)[:80]}.",
                              self.name(key), "invalid_type")
        return value

    def ranged(self, key: str, kind: str, lo: float, hi: float, default: Any = None) -> Any:
        value = self.get(key, kind, default)
        if value is not None and not lo <= value <= hi:
            raise bad_request(f"'{self.name(key)}' must be between {lo} and {hi}, got {value}.", self.name(key))
        return value

    def only(self, key: str, *noops: Any) -> None:
        """A field we do not implement: accepted only at a value that leaves the output unchanged."""
        value = self.take(key)
        if value is not None and value not in noops:
            raise bad_request(f"'{self.name(key)}' = {json.dumps(value)[:80]} is not supported by this server.",
                              self.name(key), "unsupported_parameter")

    def sub(self, key: str, required: bool = False) -> Fields | None:
        value = self.get(key, "object", required=required)
        return None if value is None else Fields(value, self.name(key))

    def finish(self, ignored: frozenset[str] = frozenset()) -> None:
        for key, value in self.data.items():
            if key not in self._read and key not in ignored and value is not None:
                raise bad_request(f"Unsupported parameter: '{self.name(key)}'.", self.name(key),
                                  "unsupported_parameter")


def str_list(f: Fields, key: str) -> list[str]:
    """A string or a list of strings (OpenAI's `stop`)."""
    value = f.take(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise bad_request(f"'{f.name(key)}' must be a string or an array of strings.", f.name(key), "invalid_type")


def int_list(f: Fields, key: str) -> list[int] | None:
    value = f.get(key, "list")
    if value is not None and not all(is_kind(v, "int") for v in value):
        raise bad_request(f"'{f.name(key)}' must be an array of integers.", f.name(key), "invalid_type")
    return value
