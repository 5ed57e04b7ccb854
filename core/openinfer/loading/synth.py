"""`openinfer synth`: a random-weight checkpoint with a preset's real shapes, config and tokenizer."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

from ..contract.plugins import get_plugins
from .weights import DummyWeights, save_safetensors


def with_num_layers(config: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The config at `num_layers` decoder layers (a text_config's where the model wraps one): per-layer lists
    (layer_types and the like) cut to that length; the real width is kept."""
    config = copy.deepcopy(config)
    body = config["text_config"] if "num_hidden_layers" not in config and "text_config" in config else config
    old = body.get("num_hidden_layers")
    if not isinstance(old, int):
        raise ValueError("this preset's config has no num_hidden_layers to override")
    if not 1 <= num_layers <= old:
        raise ValueError(f"--num-layers {num_layers} must lie in 1 .. {old} (the preset's depth)")
    for key, value in body.items():
        if isinstance(value, list) and len(value) == old:
            body[key] = value[:num_layers]
    body["num_hidden_layers"] = num_layers
    return config


def synthesize(preset: str, out: Path, seed: int = 0, dtype: str = "BF16", device: str = "cpu",
               num_layers: int | None = None) -> None:
    """`device` "cuda" draws the weights on the GPU (seconds for a 4B model instead of minutes); `num_layers`
    writes a reduced-depth checkpoint at the preset's real width. Quantized presets are written in their
    checkpoint format (INT4 packed, FP8 with block scales)."""
    plugins = get_plugins()
    found = plugins.preset(preset)
    if found is None:
        names = sorted(name for line in plugins.lines.values() for name in line.presets)
        raise ValueError(f"unknown preset {preset!r}; installed presets: {', '.join(names) or 'none'}")
    line, config = found
    if num_layers is not None:
        config = with_num_layers(config, num_layers)
    shapes = line.weight_shapes(line.parse_config(config))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = DummyWeights(shapes, seed=seed)
    get = weights.get
    if device != "cpu":
        from ..backends import get_backend
        backend = get_backend(device, "bfloat16" if dtype == "BF16" else "float32")

        def get(name: str):
            if weights.kind(name) != "F32":   # quantized tensors are drawn on the host, as stored
                return weights.get(name)
            return backend.to_host(backend.load(weights, name))
    save_safetensors(out / "model.safetensors", shapes, get, dtype, weights.kind)
    tok_dir = line.tokenizer_dir()
    if tok_dir is not None:
        for f in Path(tok_dir).iterdir():
            if f.is_file():
                shutil.copy(f, out / f.name)
