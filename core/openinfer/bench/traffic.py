"""Request arrival schedules: vLLM's gamma/Poisson process rescaled to end exactly at N/rate."""

from __future__ import annotations

import asyncio
import math
import time
from typing import AsyncIterator

import numpy as np


def arrival_offsets(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Send times (s from the start) for n requests. rate=inf sends all at t=0; burstiness=inf is a constant
    1/rate gap; otherwise gaps ~ Gamma(shape=b, scale=1/(rate*b)) (b=1: Poisson), cumulated and then
    rescaled so the last arrival lands at n/rate (vLLM: removes the 1-2 % throughput drift between seeds)."""
    if n == 0 or math.isinf(rate):
        return np.zeros(n)
    if rate <= 0:
        raise ValueError("--request-rate must be > 0 (or inf)")
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        if burstiness <= 0:
            raise ValueError("--burstiness must be > 0")
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    offsets = np.cumsum(gaps)
    return offsets * ((n / rate) / offsets[-1]) if offsets[-1] > 0 else offsets


async def paced(offsets: np.ndarray) -> AsyncIterator[int]:
    """Yields request indices at their scheduled times (late arrivals go out at once, never skipped)."""
    t0 = time.perf_counter()
    for i, off in enumerate(offsets):
        delay = t0 + float(off) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield i
