"""FP8 e4m3 weights with 128x128 block scales (DeepSeek-V3 / Kimi-K2-Instruct format): numpy dequantization.

A Linear `<p>` [out, in] is stored as `<p>.weight` float8_e4m3fn [out, in] and `<p>.weight_scale_inv` float32
[ceil(out/128), ceil(in/128)]; W[o, c] = fp8[o, c] * scale_inv[o // 128, c // 128]. The bytes are kept as uint8
(numpy has no fp8 dtype): e4m3_to_f32 decodes them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

FP8_BLOCK = 128
E4M3_MAX = 448.0
E4M3 = np.dtype(np.uint8)   # how e4m3 values are held (weights' bytes, an fp8 KV cache's arrays)


def _e4m3_table() -> np.ndarray:
    """The 256 values of e4m3fn (bias 7, no infinities; 0x7F and 0xFF are NaN)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    mag = np.where((b & 0x7F) == 0x7F, np.nan, mag)
    return (sign * mag).astype(np.float32)


E4M3_VALUES = _e4m3_table()


def e4m3_to_f32(raw: np.ndarray) -> np.ndarray:
    return E4M3_VALUES[np.asarray(raw, dtype=np.uint8)]


def row_scales(scale_inv: np.ndarray, rows: int) -> np.ndarray:
    """Block scales [.., ceil(rows/128), nb] -> one row of them per weight row [.., rows, nb] (float32)."""
    return np.repeat(np.asarray(scale_inv, dtype=np.float32), FP8_BLOCK, axis=-2)[..., :rows, :]


@dataclass
class Fp8Weight:
    """FP8 weights of one Linear (`data` uint8 [out, in], `scale` float32 [out, ceil(in/128)]) or a stack of
    experts (a leading E axis on both), backend arrays. The block scales are kept one row per weight row
    (row_scales; 1/32 of the fp8 bytes), so fused projections (gate and up) need no 128-row alignment."""
    data: Any
    scale: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def dequant(self, index: int | None = None) -> np.ndarray:
        """float32 weights (host arrays only): all of them, or expert `index` of a stack."""
        data, s = (self.data, self.scale) if index is None else (self.data[index], self.scale[index])
        data = np.asarray(data)
        cols = np.repeat(np.asarray(s, dtype=np.float32), FP8_BLOCK, axis=-1)[..., :data.shape[-1]]
        return e4m3_to_f32(data) * cols


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """e4m3fn bytes of float values: the nearest value, ties to the even one, beyond +-448 saturated to it, NaN
    kept (what the GPU's cvt.rn.satfinite gives)."""
    x = np.asarray(x, dtype=np.float32)
    finite = E4M3_VALUES[:0x7F]                       # the 127 non-negative finite values, increasing
    mag = np.minimum(np.abs(x), E4M3_MAX)
    i = np.clip(np.searchsorted(finite, mag), 1, len(finite) - 1)
    lo, hi = finite[i - 1], finite[i]
    below, above = mag - lo, hi - mag
    nearest = np.where((below < above) | ((below == above) & (i % 2 == 1)), i - 1, i)   # a tie: the even code
    nearest = np.where(np.isnan(x), 0x7F, nearest)
    return (nearest | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def quantize_fp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block-scaled e4m3 quantization of float weights [out, in]: (bytes uint8, scale_inv float32), each
    128x128 block scaled so its largest magnitude maps to 448 (tests and synthetic checkpoints)."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    nr, nc = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
    padded = np.zeros((nr * FP8_BLOCK, nc * FP8_BLOCK), np.float32)
    padded[:rows, :cols] = w
    blocks = np.abs(padded.reshape(nr, FP8_BLOCK, nc, FP8_BLOCK)).max(axis=(1, 3))
    scale_inv = np.where(blocks == 0, 1.0, blocks / E4M3_MAX).astype(np.float32)
    full = np.repeat(row_scales(scale_inv, rows), FP8_BLOCK, axis=-1)[:, :cols]
    return to_e4m3(w / full), scale_inv
