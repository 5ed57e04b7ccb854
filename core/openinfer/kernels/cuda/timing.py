"""Timing a GPU pass as a CUDA-graph replay, for the start-up tuners (lt_tune.py, gemv_tune.py): a Python loop of
launches would be slower than the GPU at decode sizes and time itself."""
from __future__ import annotations

import statistics
from typing import Callable

import cupy as cp

RUNS = 5   # timed replays after an eager pass and a first replay (median)


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
