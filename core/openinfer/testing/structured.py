"""A JSON Schema with every kind of constraint the structured-output tests exercise, and its check
written by hand (no validator library), so a test sees exactly which rule an output broke."""
from __future__ import annotations

from typing import Any

COLORS = ["red", "green", "blue"]
# every value is bounded (maxLength, integer ranges, an enum), so even a tiny random model completes it
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "color": {"enum": COLORS},
    "admin": {"type": "boolean"},
    "home": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99}},
             "required": ["x"], "additionalProperties": False}},
    "required": ["name", "age", "color", "admin", "home"], "additionalProperties": False}


def check_person(obj: Any) -> None:
    """Assert that `obj` (parsed JSON) satisfies PERSON."""
    assert isinstance(obj, dict) and set(obj) == {"name", "age", "color", "admin", "home"}, obj
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 12, obj
    assert type(obj["age"]) is int and 0 <= obj["age"] <= 150, obj
    assert obj["color"] in COLORS, obj
    assert type(obj["admin"]) is bool, obj
    home = obj["home"]
    assert isinstance(home, dict) and set(home) == {"x"} and type(home["x"]) is int and -99 <= home["x"] <= 99, obj
