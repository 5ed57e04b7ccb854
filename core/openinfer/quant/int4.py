"""compressed-tensors INT4 `pack-quantized`, symmetric, group 32: the layout and its numpy dequantization.

A Linear `<p>` [out, in] is stored as
  <p>.weight_packed  int32 [out, in / 8]: nibble i (bits 4i..4i+3) of word j is element 8j + i, as q + 8 (0..15)
  <p>.weight_scale   bf16  [out, in / 32]: one scale per 32 input columns
  <p>.weight_shape   int   [2] = [out, in]
  W[o, c] = (nibble - 8) * weight_scale[o, c // 32]       (no zero point)
which is compressed-tensors' pack_to_int32 of a symmetric group quantization.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

INT4_GROUP = 32
_SHIFTS = np.arange(0, 32, 4, dtype=np.uint32)


@dataclass
class Int4Weight:
    """Packed INT4 weights of one Linear ([out, in/8], [out, in/32]) or a stack of experts ([E, out, in/8],
    [E, out, in/32]), backend arrays."""
    packed: Any
    scale: Any

    @property
    def shape(self) -> tuple[int, ...]:
        """The dequantized shape ([.., out, in])."""
        return (*self.packed.shape[:-1], self.packed.shape[-1] * 8)

    def dequant(self, index: int | None = None) -> np.ndarray:
        """float32 weights (host arrays only): all of them, or expert `index` of a stack."""
        packed, scale = (self.packed, self.scale) if index is None else (self.packed[index], self.scale[index])
        return unpack_int4(np.asarray(packed)).astype(np.float32) * np.repeat(
            np.asarray(scale, dtype=np.float32), INT4_GROUP, axis=-1)


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """int32 [..., n/8] -> int8 [..., n] in -8..7."""
    words = packed.astype(np.uint32)[..., None] >> _SHIFTS
    return ((words & 0xF).astype(np.int8) - 8).reshape(*packed.shape[:-1], packed.shape[-1] * 8)


def pack_int4(q: np.ndarray) -> np.ndarray:
    """int values in -8..7 [..., n] (n a multiple of 8) -> int32 [..., n/8] (the checkpoint layout)."""
    q = np.asarray(q)
    if q.shape[-1] % 8:
        raise ValueError(f"INT4 packing needs a multiple of 8 columns, got {q.shape[-1]}")
    if q.min(initial=0) < -8 or q.max(initial=0) > 7:
        raise ValueError("INT4 values must lie in -8..7")
    nib = (q.astype(np.int64) + 8).astype(np.uint32).reshape(*q.shape[:-1], -1, 8)
    return (nib << _SHIFTS).sum(axis=-1, dtype=np.uint32).view(np.int32)


def quantize_int4(w: np.ndarray, scale_round: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric group-32 quantization of float weights [..., out, in] (minmax observer, as compressed-tensors):
    (packed int32, scales float32). `scale_round` maps the scales before use (e.g. to bf16 precision), so the
    codes are computed with the scales the checkpoint stores."""
    w = np.asarray(w, dtype=np.float32)
    if w.shape[-1] % INT4_GROUP:
        raise ValueError(f"INT4 group quantization needs a multiple of {INT4_GROUP} input columns, got {w.shape[-1]}")
    g = w.reshape(*w.shape[:-1], -1, INT4_GROUP)
    scale = np.abs(g).max(axis=-1) / 7.5   # q + 8 in 0..15: the symmetric range -8..7 around the scale
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    if scale_round is not None:
        scale = np.asarray(scale_round(scale), dtype=np.float32)
    q = np.clip(np.round(g / scale[..., None]), -8, 7).reshape(w.shape)
    return pack_int4(q), scale
