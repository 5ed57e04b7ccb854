"""Quantized (or dense) Linear weights from host arrays onto a backend: fused projections, stacked experts."""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from .fp8 import Fp8Weight
from .int4 import Int4Weight

HostLinear = np.ndarray | Int4Weight | Fp8Weight


def _parts(w: HostLinear) -> tuple[np.ndarray, ...]:
    if isinstance(w, Int4Weight):
        return w.packed, w.scale
    if isinstance(w, Fp8Weight):
        return w.data, w.scale
    return (w,)


def _rebuild(like: HostLinear, parts: Sequence[Any]) -> Any:
    if isinstance(like, Int4Weight):
        return Int4Weight(*parts)
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
    yields them, so the host holds one expert's arrays at a time (a Kimi-K2 layer's 384 INT4 experts are 8 GB)."""
    it = iter(ws)
    head = next(it)
    first = [backend.asarray(p, dt) for p, dt in zip(_parts(head), _dtypes(head))]
    stacks = [backend.zeros((count, *a.shape), str(a.dtype)) for a in first]
    for s, a in zip(stacks, first):
        s[0] = a
    e = 0
    for e, w in enumerate(it, 1):
        _same_format([head, w])
        for s, p, dt in zip(stacks, _parts(w), _dtypes(w)):
            s[e] = backend.asarray(p, dt)
    if e + 1 != count:
        raise ValueError(f"stack_to_backend: {e + 1} experts given for a stack of {count}")
    return _rebuild(head, stacks)
