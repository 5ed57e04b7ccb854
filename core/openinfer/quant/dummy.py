"""Random tensors of the quantized layouts, for dummy weights and `openinfer synth`: packed INT4 words with bf16
group scales, FP8 bytes with block scales, each scaled so the dequantized weights have about the dense dummies'
spread (std ~0.02). The format is read off the checkpoint names (quant/scheme.py writes them)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .fp8 import E4M3_VALUES

INT4_SCALE = 0.02 / 4.6       # the nibbles -8..7 drawn uniformly have std ~4.6
FP8_SCALE = 0.02 / 0.85       # the bytes drawn below decode to values of std ~0.85
_FP8_BYTES = np.flatnonzero(np.abs(np.nan_to_num(E4M3_VALUES)) <= 2.0).astype(np.uint8)


def quantized_kind(name: str, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """The safetensors dtype of a tensor of a quantized Linear (None: a plain float tensor)."""
    if name.endswith((".weight_packed", ".weight_shape")):
        return "I32"
    if name.endswith(".weight_scale") and name[: -len("_scale")] + "_packed" in shapes:
        return "BF16"
    if name.endswith(".weight") and name + "_scale_inv" in shapes:
        return "F8_E4M3"
    if name.endswith(".weight_scale_inv"):
        return "F32"
    return None


def dummy_quantized(name: str, shapes: Mapping[str, tuple[int, ...]], rng: np.random.Generator) -> np.ndarray:
    """A random tensor of quantized_kind(name) (float32 for the float scales, the stored dtype otherwise)."""
    shape = tuple(shapes[name])
    if name.endswith(".weight_packed"):
        return rng.integers(0, 2**32, size=shape, dtype=np.uint32).view(np.int32)
    if name.endswith(".weight_shape"):
        out, words = shapes[name[: -len("_shape")] + "_packed"]
        return np.array([out, words * 8], np.int32)
    if name.endswith(".weight_scale"):
        return np.full(shape, INT4_SCALE, np.float32)
    if name.endswith(".weight_scale_inv"):
        return np.full(shape, FP8_SCALE, np.float32)
    return rng.choice(_FP8_BYTES, size=shape)
