"""Quantized (or dense) Linear weights from host arrays onto a backend: fused projections, stacked experts."""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from .fp8 import Fp8Weight
from .int4 import Int4Weight, tile_into, tiled_shapes

HostLinear = np.ndarray | Int4Weight | Fp8Weight


def _parts(w: HostLinear) -> tuple[np.ndarray, ...]:
    if isinstance(w, Int4Weight):
        return w.packed, w.scale
    if isinstance(w, Fp8Weight):
        return w.data, w.scale
    return (w,)


def _rebuild(like: HostLinear, parts: Sequence[Any]) -> Any:
    if isinstance(like, Int4Weight):
        return Int4Weight(*parts, like.tiled)
    if isinstance(like, Fp8Weight):
        return Fp8Weight(*parts)
    return parts[0]


def _same_format(ws: Sequence[HostLinear]) -> None:
    kinds = {type(w).__name__ for w in ws}
    if len(kinds) > 1:
        raise ValueError(f"cannot fuse or stack weights stored in different formats ({', '.join(sorted(kinds))})")


def fuse_rows(ws: Sequence[HostLinear]) -> HostLinear:
    """Linears of one input concatenated along their output rows (gate then up: one GEMM)."""
    _same_format(ws)
    if len(ws) == 1:
        return ws[0]
    return _rebuild(ws[0], [np.concatenate(p, axis=0) for p in zip(*(_parts(w) for w in ws))])


def _dtypes(w: HostLinear) -> tuple[str | None, ...]:
    """Device dtypes of the parts: packed ints and fp8 bytes as stored, INT4 scales in the model dtype (they are
    bf16 in the checkpoint), FP8 scales in float32 (they are float32 in the checkpoint)."""
    if isinstance(w, Int4Weight):
        return None, None
    if isinstance(w, Fp8Weight):
        return None, "float32"
    return (None,)


def to_backend(backend: Any, w: HostLinear) -> Any:
    """One Linear on the device in its format."""
    return _rebuild(w, [backend.asarray(p, dt) for p, dt in zip(_parts(w), _dtypes(w))])


def stack_to_backend(backend: Any, ws: Iterable[HostLinear], count: int) -> Any:
    """`count` experts' Linears as one device stack [E, ...] in their format, copied one expert at a time as `ws`
    yields them, so the host holds one expert's arrays at a time (a Kimi-K2 layer's 384 INT4 experts are 8 GB).
    INT4 experts are tiled on the device as they arrive (int4.tile_into: the expert kernels' layout)."""
    stacks: list[Any] = []
    head = None
    e = -1
    for e, w in enumerate(ws):
        head = w if head is None else head
        _same_format([head, w])
        parts = [backend.asarray(p, dt) for p, dt in zip(_parts(w), _dtypes(w))]
        tiled = isinstance(w, Int4Weight)
        if not stacks:
            shapes = tiled_shapes(*w.shape) if tiled else [p.shape for p in parts]
            stacks = [backend.zeros((count, *shape), str(p.dtype)) for shape, p in zip(shapes, parts)]
        if tiled:
            tile_into(stacks[0][e], stacks[1][e], *parts)
        else:
            for s, p in zip(stacks, parts):
                s[e] = p
    if e + 1 != count:
        raise ValueError(f"stack_to_backend: {e + 1} experts given for a stack of {count}")
    return _rebuild(head, stacks) if not isinstance(head, Int4Weight) else Int4Weight(*stacks, tiled=True)
