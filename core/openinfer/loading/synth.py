"""`openinfer synth`: a random-weight checkpoint with a preset's real shapes, config and tokenizer."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ..contract.plugins import get_plugins
from .config import with_num_layers
from .weights import DummyWeights, save_safetensors


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
