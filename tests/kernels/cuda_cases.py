"""What the CUDA op tests share (test_cuda_elementwise, _gemv, _attention, _ops): the GPU check, the dtypes
with their tolerances, the fixtures (imported by each module) and the host/device conversions.

bf16 cases round the inputs to bf16 first, so both sides see identical data and only the kernel's own rounding
(fp32 accumulation, bf16 stores) is measured; f32 cases are tight.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import pytest

from openinfer.testing.cuda import kernel_stream, require_gpu

cp = require_gpu()
ml_dtypes = pytest.importorskip("ml_dtypes")

BF16 = np.dtype(ml_dtypes.bfloat16)
own_stream = pytest.fixture(autouse=True)(kernel_stream)
DTYPES = {"bfloat16": (BF16, 2e-2, 2e-2), "float32": (np.dtype(np.float32), 1e-5, 1e-4)}


@pytest.fixture(params=list(DTYPES))
def dt(request):
    return DTYPES[request.param]


@pytest.fixture(params=[False, True])
def pdl(request, monkeypatch):
    """The test runs with programmatic dependent launch off, then on for every kernel (not only the
    default's small ones); the fixture's value says which."""
    from openinfer.kernels.cuda import pdl as pdl_mod
    monkeypatch.setattr(pdl_mod, "ENABLED", request.param)
    monkeypatch.setattr(pdl_mod, "KERNELS", ("",))
    return request.param


@pytest.fixture(autouse=True)
def arrival_counters_left_zero():
    """Every kernel that counts block arrivals (split decode attention) leaves its counters zero: a count left
    behind breaks the next launch that uses them."""
    yield
    from openinfer.kernels.cuda.module import COUNTER_PURPOSES, _counters
    cp.cuda.Device().synchronize()
    left = {f"{purpose} (lane {lane})": np.flatnonzero(cp.asnumpy(c))[:8].tolist()
            for (dev, lane, purpose), c in list(_counters.items())
            if dev == cp.cuda.Device().id and purpose in COUNTER_PURPOSES and c.any()}
    assert not left, f"arrival counters left non-zero (purpose: first slots): {left}"


@contextlib.contextmanager
def after_inputs(stream: "cp.cuda.Stream") -> Iterator["cp.cuda.Stream"]:
    """Enter `stream` (a capture's) once the work queued on the current stream, the test's inputs, is done:
    a non-blocking stream is not ordered after it, and a kernel could read inputs still being copied."""
    cp.cuda.get_current_stream().synchronize()
    with stream:
        yield stream


def captured(fn, stream: "cp.cuda.Stream", pool: "cp.cuda.MemoryPool"):
    """fn() captured into a CUDA graph on `stream`, allocating from `pool`, the graph's own (as cuda_graphs.py
    does; the caller keeps it as long as the graph, whose temporaries live there): (its output, the graph)."""
    with cp.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        out = fn()
        graph = stream.end_capture()
    return out, graph


def replayed(graph, stream: "cp.cuda.Stream", out) -> np.ndarray:
    """The graph replayed on `stream` into its output `out`, zeroed first (so an unwritten element shows): out on
    the host, as float32."""
    out[...] = 0
    graph.launch(stream)
    stream.synchronize()
    return host(out)


def rnd(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def dev(x: np.ndarray, dtype) -> "cp.ndarray":
    return cp.asarray(x.astype(dtype)) if x.dtype.kind == "f" else cp.asarray(x)


def host(x) -> np.ndarray:
    return cp.asnumpy(x).astype(np.float32)


def exact(x: np.ndarray, dtype) -> np.ndarray:
    """x as the kernel sees it after storage rounding."""
    return x.astype(dtype).astype(np.float32)


def close(got, want, dt, scale=1.0):
    _, atol, rtol = dt
    np.testing.assert_allclose(host(got), want, atol=atol * scale, rtol=rtol)
