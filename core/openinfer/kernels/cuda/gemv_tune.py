"""The GEMV's split-K factor per weight shape (blas.gemv_splits), chosen at start-up by timing, kept on disk.

The one-wave rule misses by up to a third on some shapes. On the H200 at M = 1, Qwen3-4B's qkv (2560 -> 6144) took
13.5 µs at the rule's 2 splits and 9.9 µs at 1, and Qwen3.5's GDN in_proj (2560 -> 12352) took 29.1 µs at 1 and 21.1
µs at 5. The wave's fill, each warp's share of whole loop iterations and the split-K reduction interact there, which
no simple rule captured.


`tune` times each candidate at M = 1 as a graph replay over weight copies larger than L2, so the weights come from
HBM as in a decode step. It keeps the fastest unless the rule's own factor is within TOLERANCE of it. It runs in
loading/loader.py's "GEMM tuning" phase, before any graph is captured, so eager and graph steps use the same factor, and
so does the SiLU-epilogue GEMV, which splits as the plain one on the same weight: the same bits either way.
The cache (tuning.py, folder gemv_splits) is keyed by the GPU, its SM count and the compiled GEMV.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import cupy as cp

from . import blas
from .compile import arch_for, compile_source
from .tuning import cache_path, gpu_key, read_choices, replay_us, scratch, write_choices

CANDIDATES = (1, 2, 3, 4, 5, 6, 8)
TOLERANCE = 0.97                # another factor replaces the rule's only if at least 3 % faster
MIN_SPLIT_CHUNKS = 16           # 8-k chunks a split keeps at least: one per lane group of each of its 4 warps


@dataclass(frozen=True)
class Tuned:
    cached: int                    # shapes whose factor came from the cache
    timed: int                     # shapes timed now
    changes: tuple[str, ...] = ()  # of all these, those whose factor differs from the rule's: "NxK rule->chosen"


def candidates(n: int, k: int, rule: int) -> list[int]:
    """The rule's factor first, then the others this weight allows (MIN_SPLIT_CHUNKS a split)."""
    ok = [s for s in CANDIDATES if s == 1 or k // 8 >= MIN_SPLIT_CHUNKS * s]
    return [rule, *(s for s in ok if s != rule)]


def device_key(dev: int) -> dict[str, Any]:
    """What a saved choice depends on: the GPU and the compiled GEMV (its cubin's name carries
    compile.py's hash of the sources, options and NVRTC version)."""
    gpu = gpu_key(dev)
    major, minor = (int(v) for v in gpu["cc"].split("."))
    return {**gpu, "sources": compile_source("gemv", arch_for(major, minor)).stem}


def saved_splits(path: Path, key: dict[str, Any]) -> dict[str, int]:
    """The saved "N,K" -> factor (tuning.read_choices), without entries that are not a factor."""
    return {name: s for name, s in read_choices(path, key).items() if isinstance(s, int) and s >= 1}


def time_splits(n: int, k: int, factors: list[int], dev: int, stream: cp.cuda.Stream) -> list[float]:
    """µs per GEMV at M = 1 for each split-K factor (set in blas.gemv_split_choice while it is timed)."""
    x, ws, y = scratch(1, n, k)
    times = []
    for s in factors:
        blas.gemv_split_choice[(dev, n, k)] = s
        times.append(replay_us(lambda: [blas.gemv(x, w, y) for w in ws], stream) / len(ws))
    return times


def tune(shapes: Iterable[tuple[int, int]]) -> Tuned:
    """A split-K factor in blas.gemv_split_choice for each bf16 weight (N, K) the GEMV can take, on the current
    device; shapes chosen before are kept. Its scratch goes
    back to CuPy's pool, on a stream of its own: free_all_blocks() (backend.release_cached) returns it."""
    dev = cp.cuda.Device().id
    resident = blas.gemv_resident("gemv_bf16")
    key = device_key(dev)
    path = cache_path("gemv_splits", key)
    saved = saved_splits(path, key)
    cached = timed = 0
    changes = []
    stream = cp.cuda.Stream(non_blocking=True)   # capturable, whatever stream is current
    with stream:
        for n, k in sorted({(n, k) for n, k in shapes if k % 8 == 0 and (dev, n, k) not in blas.gemv_split_choice}):
            rule, name = blas.gemv_splits(n, k, resident), f"{n},{k}"
            factors = candidates(n, k, rule)
            if saved.get(name) in factors:   # (a factor this weight cannot take, from an edited file: timed again)
                cached += 1
            else:
                times = time_splits(n, k, factors, dev, stream)
                best = min(range(len(factors)), key=times.__getitem__)
                saved[name] = factors[best] if times[best] < TOLERANCE * times[0] else rule
                timed += 1
            blas.gemv_split_choice[(dev, n, k)] = saved[name]
            if saved[name] != rule:
                changes.append(f"{n}x{k} {rule}->{saved[name]}")
        stream.synchronize()
    if timed:
        write_choices(path, key, saved)
    return Tuned(cached, timed, tuple(changes))
