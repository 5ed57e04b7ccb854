"""Shared by the start-up tuners (lt_tune.py: cuBLASLt algorithms, gemv_tune.py: GEMV split-K factors): timing a GPU
pass as a CUDA-graph replay (a Python loop of launches would be slower than the GPU at decode sizes and time
itself), and the disk cache of their choices, one JSON file per key (cache_root()/<folder>/<hash of the key>.json:
{"key": ..., "choices": {name: choice}}), the key being what a choice depends on (the GPU, library, kernel sources)."""
from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any, Callable

import cupy as cp

from ...loading.disk_cache import cache_root, write_atomic
from .module import BF16

RUNS = 5                  # timed replays after an eager pass and a first replay (median)
FLUSH_BYTES = 128 << 20   # weight copies cycled per pass: > 2x the H200's 50 MB L2, so weights come from HBM


def replay_us(one_pass: Callable[[], None], stream: cp.cuda.Stream, runs: int = RUNS) -> float:
    """Median µs of a replay of `one_pass` captured on `stream`. An eager pass first, so that a launch that fails
    raises outside the capture."""
    one_pass()
    stream.begin_capture()
    try:
        one_pass()
    finally:   # a capture left open would break the stream for everything after
        graph = stream.end_capture()
    events = [cp.cuda.Event() for _ in range(runs + 1)]
    graph.launch(stream)   # the graph's own first launch uploads it
    events[0].record(stream)
    for event in events[1:]:
        graph.launch(stream)
        event.record(stream)
    events[-1].synchronize()
    return statistics.median(cp.cuda.get_elapsed_time(a, b) for a, b in zip(events, events[1:])) * 1e3


def scratch(m: int, n: int, k: int) -> tuple[cp.ndarray, list[cp.ndarray], cp.ndarray]:
    """x[m, K], weight copies [N, K] adding up to FLUSH_BYTES (at least one) and y[m, N], bf16 zeros."""
    copies = max(1, -(-FLUSH_BYTES // (2 * n * k)))
    return (cp.zeros((m, k), BF16), [cp.zeros((n, k), BF16) for _ in range(copies)], cp.zeros((m, n), BF16))


def gpu_key(dev: int) -> dict[str, Any]:
    """The device part of a cache key: its name, compute capability and SM count (a MIG slice has fewer SMs)."""
    props = cp.cuda.runtime.getDeviceProperties(dev)
    return {"gpu": props["name"].decode(), "cc": f"{props['major']}.{props['minor']}",
            "sms": int(props["multiProcessorCount"])}


def cache_path(folder: str, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / folder / f"{digest}.json"


def read_choices(path: Path, key: dict[str, Any]) -> dict[str, Any]:
    """The saved choices, or {} where the file is missing, unreadable or another key's."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    ok = isinstance(data, dict) and data.get("key") == key and isinstance(data.get("choices"), dict)
    return dict(data["choices"]) if ok else {}


def write_choices(path: Path, key: dict[str, Any], choices: dict[str, Any]) -> None:
    write_atomic(path, json.dumps({"key": key, "choices": choices}, indent=1, sort_keys=True).encode())
