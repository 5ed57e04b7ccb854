"""An experiment, off by default: warm L2 with the start of the next GEMV's weights on a side stream.

At batch 1 a decode step is a chain of weight GEMVs with small latency-bound kernels between them
(RoPE + KV write, decode attention, add + RMSNorm) that leave HBM nearly idle, and each GEMV
ramps up from cold. `prefetch(w)`, called right after a GEMV is launched, forks a side stream off
the current one (an event), launches prefetch_l2 there over the first OPENINFER_L2_PREFETCH_MB MiB
of the next weight, and leaves it running beside the small kernels; `join()` (the backend's
end_forward, after every forward) makes the current stream wait for the side stream, which a CUDA
graph capture requires of forked work before end_capture. The prefetch writes no memory, so
nothing else is ordered against it and results are unchanged.

Only while the current stream captures a CUDA graph (the decode steps): eager steps (prefill,
large batches) skip it. OPENINFER_L2_PREFETCH_MB=0 (the default) or unset: no launch, no fork.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import cupy as cp
import numpy as np

from .module import launch, sm_count

MB = int(os.environ.get("OPENINFER_L2_PREFETCH_MB", "0") or 0)   # MiB of each next weight; 0: off
LINE = 128                 # bytes one thread prefetches per step (an L2 line)
THREADS = 128
CTAS_PER_SM = 2            # a light grid: it runs beside the small kernels, not instead of them


@dataclass
class _Side:
    """One device's side stream, its fork and join events, and whether it has work to join."""
    stream: Any
    fork: Any
    join: Any
    pending: bool = False


_sides: dict[int, _Side] = {}


def _side() -> _Side:
    dev = cp.cuda.Device().id
    if dev not in _sides:
        _sides[dev] = _Side(cp.cuda.Stream(non_blocking=True), cp.cuda.Event(disable_timing=True),
                            cp.cuda.Event(disable_timing=True))
    return _sides[dev]


def prefetch(w: cp.ndarray) -> None:
    """Warm L2 with the first MB MiB of weight w on the side stream (see the module doc); no effect on results."""
    if MB <= 0:   # off (the default): nothing but this test on the host
        return
    main = cp.cuda.get_current_stream()
    if not main.is_capturing():
        return
    nbytes = min(MB << 20, w.nbytes)
    side = _side()
    side.fork.record(main)
    side.stream.wait_event(side.fork)
    with side.stream:
        launch("elementwise", "prefetch_l2", (min(-(-nbytes // (LINE * THREADS)), CTAS_PER_SM * sm_count()),),
               THREADS, (w, np.int64(nbytes)))
    side.pending = True


def join() -> None:
    """Make the current stream wait for the side stream's prefetches, if any were launched since the last join."""
    side = _sides.get(cp.cuda.Device().id)
    if side is None or not side.pending:
        return
    side.join.record(side.stream)
    cp.cuda.get_current_stream().wait_event(side.join)
    side.pending = False
