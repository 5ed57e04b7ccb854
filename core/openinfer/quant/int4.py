"""compressed-tensors INT4 `pack-quantized`, symmetric, group 32: the layout and its numpy dequantization.

A Linear `<p>` [out, in] is stored as
  <p>.weight_packed  int32 [out, in / 8]: nibble i (bits 4i..4i+3) of word j is element 8j + i, as q + 8 (0..15)
  <p>.weight_scale   bf16  [out, in / 32]: one scale per 32 input columns
  <p>.weight_shape   int   [2] = [out, in]
  W[o, c] = (nibble - 8) * weight_scale[o, c // 32]       (no zero point)
which is compressed-tensors' pack_to_int32 of a symmetric group quantization.

Expert stacks are staged in a tiled layout (`tile_int4`), the order in which the GPU expert kernels stream them: an
expert's rows [N, K] in tiles of 16, tile j holding rows 8j .. 8j + 7 (tile rows 0..7) and N/2 + 8j .. N/2 + 8j + 7
(tile rows 8..15), the pair of rows one lane group of a tensor-core warp reads (gate_up: an output's gate and up
rows). A tile is stored chunk by chunk (a chunk: 32 weights, 16 bytes, one scale), each chunk's 16 rows together:
  packed [E, N/16, K/32, 16, 4] int32       scale [E, N/16, ceil(K/64), 16, 2]
the scales of chunks 2p and 2p + 1 of a row side by side (one 4-byte read). A warp's 4-byte reads of 8 rows' chunk
then cover one 128-byte line, where in the checkpoint's layout they touch 8.
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
    [E, out, in/32], or with `tiled` the tile_int4 layout), backend arrays."""
    packed: Any
    scale: Any
    tiled: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        """The dequantized shape ([.., out, in])."""
        if self.tiled:
            *lead, tiles, chunks, rows, words = self.packed.shape
            return (*lead, tiles * rows, chunks * words * 8)
        return (*self.packed.shape[:-1], self.packed.shape[-1] * 8)

    def dequant(self, index: int | None = None) -> np.ndarray:
        """float32 weights (host arrays only): all of them, or expert `index` of a stack."""
        packed, scale = (self.packed, self.scale) if index is None else (self.packed[index], self.scale[index])
        packed, scale = np.asarray(packed), np.asarray(scale, dtype=np.float32)
        if self.tiled:
            packed, scale = untile_int4(packed, scale)
        return unpack_int4(packed).astype(np.float32) * np.repeat(scale, INT4_GROUP, axis=-1)

    def tiles(self) -> "Int4Weight":
        """This stack (host arrays) in the tiled layout the GPU expert kernels read."""
        return self if self.tiled else Int4Weight(*tile_int4(np.asarray(self.packed), np.asarray(self.scale)), True)


def tile_position(row: int, rows: int) -> tuple[int, int]:
    """(tile, tile row) of row `row` of an expert of `rows` rows in the tiled layout."""
    half = rows // 2
    upper, r = divmod(row, half)
    return r // 8, 8 * upper + r % 8


def tiled_shapes(rows: int, cols: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The tiled layout's (words, scales) shapes of one expert's [rows, cols] weights."""
    if rows % 16:
        raise ValueError(f"INT4 expert rows come in tiles of 16: {rows} rows")
    chunks = cols // INT4_GROUP
    return (rows // 16, chunks, 16, 4), (rows // 16, -(-chunks // 2), 16, 2)


def tile_into(words: Any, scales: Any, packed: Any, scale: Any) -> None:
    """One expert's [N, K/8] words and [N, K/32] scales into zeroed arrays of tiled_shapes (module docstring), by
    strided copies only, so numpy and CuPy arrays alike (the CUDA backend tiles on the device)."""
    T, C = words.shape[:2]
    words[...] = packed.reshape(2, T, 8, C, 4).transpose(1, 3, 0, 2, 4).reshape(words.shape)
    src = scale.reshape(2, T, 8, C).transpose(1, 3, 0, 2)        # tile, chunk, half, row in half
    dst = scales.reshape(T, -1, 2, 8, 2)                          # tile, chunk pair, half, row in half, chunk
    dst[..., 0] = src[:, 0::2]
    dst[:, : C // 2, ..., 1] = src[:, 1::2]


def tile_int4(packed: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., N, K/8] words and [..., N, K/32] scales (an expert or a stack) -> the tiled layout (host arrays). N must
    be a multiple of 16, as every INT4 expert's is (its other projection's input, K % 32 == 0)."""
    *lead, N, W = packed.shape
    wshape, sshape = tiled_shapes(N, 8 * W)
    words, scales = np.zeros((*lead, *wshape), packed.dtype), np.zeros((*lead, *sshape), scale.dtype)
    for i in np.ndindex(*lead):
        tile_into(words[i], scales[i], packed[i], scale[i])
    return words, scales


def untile_int4(packed: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of tile_int4."""
    *lead, T, C, _, _ = packed.shape
    a = len(lead)
    lead_axes = tuple(range(a))
    order = (*lead_axes, a + 2, a, a + 3, a + 1, a + 4)   # back to half, tile, row in half, chunk (pair), word
    words = packed.reshape(*lead, T, C, 2, 8, 4).transpose(order).reshape(*lead, 16 * T, 4 * C)
    s = scale.reshape(*lead, T, -1, 2, 8, 2).transpose(order).reshape(*lead, 16 * T, -1)[..., :C]
    return np.ascontiguousarray(words), np.ascontiguousarray(s)


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
