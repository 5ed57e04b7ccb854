"""Where the skinny GEMM (skinny_gemm.py) replaces cuBLASLt or the GEMV, and how: chosen at start-up by timing, kept on
disk. Used when OPENINFER_SKINNY_GEMM=tune (and "1", which takes the kernel above 8 rows anyway).

For each bf16 weight (N, K) and each batch width (8 / 16 / 32 / 64 / 128) that a decode-graph bucket falls in, `tune`
times what blas.linear runs without this kernel (cuBLASLt's tuned algorithm above 8 rows, the GEMV with its tuned split
up to 8: lt_tune and gemv_tune run first) against the skinny GEMM under every split-K factor, in each of its variants
(one CTA a SM; two with half the stages, up to width 64). Each runs as a graph replay over weight copies larger than
L2, with PDL where the decode graphs of that size have it, at the largest bucket size of the width (the smallest up to
8 rows: batch 1). The skinny GEMM is chosen, with its fastest (factor, variant), only if that is at least 3 % faster;
otherwise the width keeps the other path (choice (0, 1)). One choice per width, not per M: a batch row's bits do not
depend on the padding around it, so eager and graph steps of one width compute the same bits. The cache (tuning.py,
folder skinny_gemm) is keyed by the GPU, the compiled kernel and the cuBLASLt switch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import cupy as cp

from . import blas, lt, pdl, skinny_gemm as sg
from .compile import arch_for, compile_source
from .tuning import cache_path, gpu_key, read_choices, replay_us, scratch, write_choices

TOLERANCE = 0.97   # the skinny GEMM replaces the other path only if at least 3 % faster


@dataclass(frozen=True)
class Tuned:
    cached: int                     # (width, shape) pairs whose choice came from the cache
    timed: int                      # pairs timed now
    chosen: tuple[str, ...] = ()    # pairs on the skinny GEMM: "width:NxK/splits", "x2" for two CTAs a SM


def widths(ms: Iterable[int]) -> dict[int, int]:
    """Each batch width the sizes `ms` fall in -> the M it is timed at: the largest of them in it (lt_tune planned
    cuBLASLt there), except up to the GEMV's rows, where the smallest (batch 1, the latency that counts most)."""
    out: dict[int, int] = {}
    for m in ms:
        if 1 <= m <= sg.MAX_M:
            w = sg.width(m)
            out[w] = (min if m <= sg.GEMV_ROWS else max)(m, out.get(w, m))
    return dict(sorted(out.items()))


def time_choices(m: int, n: int, k: int, stream: cp.cuda.Stream) -> tuple[float, dict[sg.Choice, float]]:
    """µs per GEMM at M = m: the other path's (blas.linear with the skinny GEMM off), and the skinny GEMM's by
    (split-K factor, CTAs a SM); with PDL as the decode graphs of m rows have it (pdl.MAX_DECODE_ROWS)."""
    x, ws, y = scratch(m, n, k)
    with pdl.suspended(m > pdl.MAX_DECODE_ROWS):
        with sg.mode("0"):
            other_us = replay_us(lambda: [blas.linear(x, w) for w in ws], stream) / len(ws)
        choices = [(s, p) for p in sg.variants(sg.width(m)) for s in range(1, min(sg.MAX_SPLITS, -(-k // sg.SG_BK)) + 1)]
        return other_us, {(s, p): replay_us(lambda: [sg.gemm(x, w, y, splits=s, per_sm=p) for w in ws], stream)
                          / len(ws) for s, p in choices}


def choose(other_us: float, times: dict[sg.Choice, float]) -> sg.Choice:
    """The fastest (factor, CTAs a SM) if it beats the other path by TOLERANCE, else (0, 1): the other path."""
    best = min(times, key=times.__getitem__)
    return best if times[best] < TOLERANCE * other_us else (0, 1)


def _saved(value: object) -> sg.Choice | None:
    """A cached choice, [splits, CTAs a SM], as a Choice; None for anything else (an edited or older file)."""
    if (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)
            and value[0] >= 0 and value[1] in (1, 2)):
        return value[0], value[1]
    return None


def tune(ms: Iterable[int], shapes: Iterable[tuple[int, int]]) -> Tuned:
    """sg.split_choice for each bf16 weight (N, K) and batch width of `ms` on the current device. Nothing where
    OPENINFER_SKINNY_GEMM=0 or the GPU is not an H100 / H200."""
    by_width = widths(ms)
    if sg.MODE == "0" or not by_width or not sg.hopper():
        return Tuned(0, 0)
    dev = cp.cuda.Device().id
    gpu = gpu_key(dev)
    major, minor = (int(v) for v in gpu["cc"].split("."))
    key = {**gpu, "sources": compile_source("skinny_gemm", arch_for(major, minor)).stem, "cublaslt": lt.ENABLED}
    path = cache_path("skinny_gemm", key)
    saved = {name: c for name, v in read_choices(path, key).items() if (c := _saved(v)) is not None}
    cached = timed = 0
    chosen: list[str] = []
    stream = cp.cuda.Stream(non_blocking=True)   # capturable, whatever stream is current
    with stream:
        for n, k in sorted(set(shapes)):
            for mp, m in by_width.items():
                name = f"{mp},{n},{k}"
                if name in saved:
                    cached += 1
                else:
                    saved[name] = choose(*time_choices(m, n, k, stream))
                    timed += 1
                sg.split_choice[(dev, mp, n, k)] = splits, per_sm = saved[name]
                if splits:
                    chosen.append(f"{mp}:{n}x{k}/{splits}" + ("x2" if per_sm == 2 else ""))
        stream.synchronize()
    if timed:
        write_choices(path, key, {name: list(c) for name, c in saved.items()})
    return Tuned(cached, timed, tuple(chosen))
