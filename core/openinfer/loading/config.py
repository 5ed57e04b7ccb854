"""Reading a checkpoint folder's JSON files."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    pass


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} not found") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def read_model_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir)
    if not path.is_dir():
        raise ConfigError(f"model path {path} is not a directory (expected a checkpoint folder with config.json)")
    return read_json(path / "config.json")


def read_generation_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "generation_config.json"
    return read_json(path) if path.exists() else {}


def require(config: dict[str, Any], key: str, kind: type | tuple[type, ...], minimum: int | None = 1) -> Any:
    """Fetch a required config.json field with a type check that names it; an integer field (a size or a count) must
    also be at least `minimum` (None: any)."""
    if key not in config:
        raise ConfigError(f"config.json lacks {key!r}")
    return _checked(key, config[key], kind, minimum if kind is int else None)


def optional(config: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any,
             minimum: float | None = None, positive: bool = False) -> Any:
    """An optional config.json field: `default` when absent or null, else checked as `require` checks (an integer
    where a number is asked is fine), at least `minimum`, and above zero if `positive`."""
    value = config.get(key)
    if value is None:
        return default
    value = _checked(key, value, (int, float) if kind is float else kind, minimum)
    if positive and not value > 0:
        raise ConfigError(f"config.json field {key!r} is {value}; it must be above 0")
    return value


def _checked(key: str, value: Any, kind: type | tuple[type, ...], minimum: float | None) -> Any:
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise ConfigError(f"config.json field {key!r} has type {type(value).__name__}, expected {kind}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"config.json field {key!r} is {value}; it must be at least {minimum}")
    return value


def with_num_layers(config: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The config at `num_layers` decoder layers (a text_config's where the model wraps one): per-layer lists
    (layer_types and the like) cut to that length; the real width is kept."""
    config = copy.deepcopy(config)
    body = config["text_config"] if "num_hidden_layers" not in config and "text_config" in config else config
    old = body.get("num_hidden_layers")
    if not isinstance(old, int):
        raise ValueError("this preset's config has no num_hidden_layers to override")
    if not 1 <= num_layers <= old:
        raise ValueError(f"--num-layers {num_layers} must lie in 1 .. {old} (the model's depth)")
    for key, value in body.items():
        if isinstance(value, list) and len(value) == old:
            body[key] = value[:num_layers]
    body["num_hidden_layers"] = num_layers
    return config


def with_overrides(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The config with `overrides` (--hf-overrides) set: an object value merges into the field's object, key by key,
    as vLLM's hf_overrides do; any other value replaces the field."""
    config = copy.deepcopy(config)
    for key, value in overrides.items():
        old = config.get(key)
        config[key] = with_overrides(old, value) if isinstance(old, dict) and isinstance(value, dict) \
            else copy.deepcopy(value)
    return config
