"""GPU test modules and benchmarks: skip a module without a usable NVIDIA GPU, the demo engine on the GPU, run a
test on its own stream, time a function as a CUDA-graph replay; the CUDA backend itself (CudaBackend imports CuPy
only when one is built)."""
from __future__ import annotations

from typing import Any, Callable, Iterator

from pathlib import Path

from ..backends.cuda_backend import CudaBackend
from ..kernels.cuda import compile as kc

__all__ = ["CudaBackend", "compile_cubin", "demo_engine_on_gpu", "graph_ms", "kernel_stream", "require_gpu",
           "require_nvrtc"]


def require_nvrtc() -> None:
    """Skip the calling test where no NVRTC library is there to compile the sources (no GPU needed)."""
    import pytest
    try:
        kc._nvrtc()
    except kc.KernelCompileError as e:
        pytest.skip(f"no NVRTC library to compile with: {e}")


def compile_cubin(source: str | Path, arch: str = "sm_90a") -> bytes:
    """`source` (a core source's name or a plugin's path) compiled by NVRTC for `arch`: the cubin's bytes (through
    the engine's own compile layer and its disk cache)."""
    return kc.compile_source(source, arch).read_bytes()


def require_gpu() -> Any:
    """The cupy module, or skip the calling test module (no cupy, no driver, or no device)."""
    import pytest
    cp = pytest.importorskip("cupy", reason="cupy is not installed")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
    except Exception as e:  # no driver, or one too old for this cupy build
        pytest.skip(f"no usable NVIDIA GPU: {e}", allow_module_level=True)
    return cp


def demo_engine_on_gpu(mode: str, max_model_len: int) -> Any:
    """The built-in demo model on the GPU, sampling on the device, for the engine-level GPU tests; `mode` "graphs"
    (decode CUDA graphs) or "eager". float32: a row's greedy or seeded tokens equal alone and batched only while
    its logits do, and bf16 GEMMs of other batch shapes may round differently."""
    from ..engine.engine import EngineArgs, build_engine
    eng = build_engine(None, EngineArgs(device="cuda", dtype="float32", max_model_len=max_model_len, max_num_seqs=4,
                                        kv_cache_memory_gib=0.05, enforce_eager=mode == "eager"))
    eng.runner.backend.activate()
    assert eng.runner.backend.samples_on_device
    return eng


def kernel_stream() -> Iterator[Any]:
    """Run the test on a stream of its own, as the engine runs: kernels launch with programmatic
    dependent launch only off the legacy default stream (kernels/cuda/pdl.py), so this is what tests
    them under it. Kernel test modules use it as an autouse fixture:
    `own_stream = pytest.fixture(autouse=True)(kernel_stream)`."""
    import cupy as cp
    with cp.cuda.Stream(non_blocking=True) as stream:
        yield stream


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """Bytes read + written per second by a device-to-device copy of `nbytes`: the rate the benchmarks' bytes-moved
    floors are taken at."""
    import cupy as cp
    a = cp.ones(nbytes, cp.uint8)
    b = cp.empty_like(a)
    cp.copyto(b, a)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(repeats):
        cp.copyto(b, a)
    end.record()
    end.synchronize()
    return 2 * nbytes * repeats / (cp.cuda.get_elapsed_time(start, end) * 1e-3)


def graph_ms(fn: Callable[[], Any], repeats: int = 10, calls: int = 1) -> float:
    """Median ms of one fn() as a CUDA-graph replay. fn() runs once eagerly (loading its kernels), then `calls`
    times into one graph, captured on a stream and from a memory pool of their own (a buffer baked into a graph
    must never go back to a pool others allocate from), replayed `repeats` times between CUDA events. The device
    is synchronised first: inputs made on the legacy default stream, whose copies from pageable memory return
    before their DMA lands, are complete before fn's kernels on the non-blocking stream read them."""
    import cupy as cp
    import numpy as np
    cp.cuda.Device().synchronize()
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc), stream:
        fn()
        stream.begin_capture()
        for _ in range(calls):
            fn()
        graph = stream.end_capture()
        graph.launch(stream)
        times = []
        for _ in range(repeats):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / calls)
    return float(np.median(times))


def cold_us(fn: Callable[[], Any], repeats: int = 50) -> float:
    """Median µs of one eager fn() between CUDA events with L2 cold: a 512 MB fill before each call flushes it (and
    gives the host time to enqueue the call before the GPU gets to it), as in a decode step whose layer's operands
    are not in L2."""
    import cupy as cp
    import numpy as np
    flush = cp.empty(512 << 20, cp.uint8)
    fn()
    times = []
    for _ in range(repeats):
        flush.fill(1)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    return float(np.median(times))
