"""Loading compiled kernels onto the current device and launching them on the current stream."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import cupy as cp
import ml_dtypes
import numpy as np

from ...loading.phases import phase
from . import lanes, pdl
from .compile import arch_for, compile_source

BF16 = np.dtype(ml_dtypes.bfloat16)
_SUFFIX = {BF16: "bf16", np.dtype(np.float32): "f32"}
_DEFAULT_SMEM = 48 * 1024  # past this, static and dynamic together, a kernel must opt in to more shared memory
NULL = np.uint64(0)        # a null pointer argument
COUNTER_SLOTS = 4096       # arrival counters of one purpose (arrival_counters)

_modules: dict[tuple[int, str], Any] = {}
_functions: dict[tuple[int, str, str], Any] = {}
_smem_optin: dict[tuple[int, str, str], int] = {}
_sm_count: dict[int, int] = {}
_occupancy: dict[tuple, int] = {}
_capability: dict[int, int] = {}
_counters: dict[tuple[int, str, str], cp.ndarray] = lanes.per_lane({})   # (device, lane, purpose) -> its counters


def suffix(dtype: np.dtype) -> str:
    """The kernel-name suffix of a storage dtype; a clear error for anything else."""
    try:
        return _SUFFIX[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"CUDA kernels take bfloat16 or float32 arrays, not {dtype}") from None


def _function(source: str | Path, name: str) -> Any:
    dev = cp.cuda.Device().id
    key = (dev, source, name)
    fn = _functions.get(key)
    if fn is None:
        mod = _modules.get((dev, source))
        if mod is None:
            with phase(f"kernel module {Path(source).name if isinstance(source, Path) else source + '.cu'}"):   # a start-up phase: cache lookup (or compile) and load
                cc = cp.cuda.Device(dev).compute_capability
                mod = cp.RawModule(path=str(compile_source(source, arch_for(int(cc[:-1]), int(cc[-1])))))
                fn = mod.get_function(name)   # a cubin module loads at its first lookup
            _modules[(dev, source)] = mod
        else:
            fn = mod.get_function(name)
        _functions[key] = fn
    return fn


def _function_with_smem(source: str | Path, name: str, smem: int) -> Any:
    """The kernel, opted in to `smem` bytes of dynamic shared memory where that and its static shared memory
    exceed the default (a launch past it without the opt-in fails)."""
    fn = _function(source, name)
    if smem and smem + fn.shared_size_bytes > _DEFAULT_SMEM:
        key = (cp.cuda.Device().id, source, name)
        if _smem_optin.get(key, 0) < smem:
            fn.max_dynamic_shared_size_bytes = smem
            _smem_optin[key] = smem
    return fn


def launch(source: str | Path, name: str, grid: Sequence[int], block: int, args: tuple, smem: int = 0,
           cluster: tuple[int, int, int] | None = None, dependent: bool = False) -> None:
    """Launch kernel `name` of `source` (a core source's name or a plugin's .cu path, see
    compile.source_path) on the current stream (so CUDA-graph capture sees it), with programmatic
    dependent launch where it is on and the device has it (pdl.py) for the core's kernels of pdl.KERNELS and
    any kernel launched `dependent` (it keeps the rule of common.cuh: it waits before reading what the previous
    kernel writes), in thread-block clusters of `cluster` CTAs (sm_90+) if given."""
    fn = _function_with_smem(source, name, smem)
    on = pdl.available() if dependent else pdl.enabled(name)
    if on or cluster:
        pdl.launch(fn.kernel.ptr, grid, block, args, smem, pdl_on=on, cluster=cluster)
    else:
        fn(tuple(int(g) for g in grid), (block,), args, shared_mem=smem)


def blocks_per_sm(source: str, name: str, block: int, smem: int = 0) -> int:
    """How many blocks of the kernel one SM holds at once (its registers and shared memory counted)."""
    key = (cp.cuda.Device().id, source, name, block, smem)
    if key not in _occupancy:
        fn = _function_with_smem(source, name, smem)
        _occupancy[key] = max(1, cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, block, smem))
    return _occupancy[key]


def clusters_at_once(source: str, name: str, block: int, smem: int, cluster: int) -> int:
    """How many thread-block clusters of `cluster` CTAs of the kernel the GPU runs at once (its SMs' registers and
    shared memory and their grouping into GPCs counted)."""
    key = (cp.cuda.Device().id, source, name, block, smem, cluster)
    if key not in _occupancy:
        fn = _function_with_smem(source, name, smem)
        _occupancy[key] = pdl.max_active_clusters(fn.kernel.ptr, block, smem, cluster)
    return _occupancy[key]


def compute_capability() -> int:
    """The current device's compute capability as one number (90 for sm_90)."""
    dev = cp.cuda.Device().id
    if dev not in _capability:
        _capability[dev] = int(cp.cuda.Device(dev).compute_capability)
    return _capability[dev]


def clusters_supported() -> bool:
    """Thread-block clusters need sm_90+; older GPUs run the kernels that use them unsplit (gemv.cu) or not at all."""
    return compute_capability() >= 90


def hopper() -> bool:
    """sm_90 exactly: the wgmma kernels are built for sm_90a (elsewhere their bodies compile to nothing)."""
    return compute_capability() == 90


def sm_count() -> int:
    dev = cp.cuda.Device().id
    if dev not in _sm_count:
        _sm_count[dev] = cp.cuda.Device(dev).attributes["MultiProcessorCount"]
    return _sm_count[dev]


COUNTER_PURPOSES = ("decode_attention", "moe_router")   # split-KV decode heads, moe.py's fused router


def arrival_counters(purpose: str) -> cp.ndarray | None:
    """COUNTER_SLOTS int32 counters of the current device for kernels whose last block to arrive finishes
    the work (split-KV decode heads): zeroed once,
    and each launch leaves its slots zero again. Each purpose (COUNTER_PURPOSES) has its own region, so
    two kinds of kernels never share a slot, and each lane (lanes.py) its own set, so a graph replay and an
    eager forward running at once never do. Raw device memory outside any pool (a graph's private pool
    may go away). Every purpose's region is allocated at the lane's first call outside a capture, whichever
    purpose asks (a graph may capture a kernel that never ran eagerly); None when that first call is
    inside one (the caller then runs unsplit / unfused: correct, but slower; run the forward once eagerly
    before capturing, as cuda_graphs.py does)."""
    dev, lane = cp.cuda.Device().id, lanes.current()
    c = _counters.get((dev, lane, purpose))
    if c is None:
        if purpose not in COUNTER_PURPOSES:
            raise ValueError(f"arrival counters for {purpose!r}: add it to COUNTER_PURPOSES")
        stream = cp.cuda.get_current_stream()
        if stream.is_capturing():
            return None
        nbytes = len(COUNTER_PURPOSES) * COUNTER_SLOTS * 4
        mem = cp.cuda.Memory(nbytes)
        cp.cuda.runtime.memsetAsync(mem.ptr, 0, nbytes, stream.ptr)
        stream.synchronize()
        for i, p in enumerate(COUNTER_PURPOSES):
            _counters[(dev, lane, p)] = cp.ndarray((COUNTER_SLOTS,), cp.int32,
                                                   cp.cuda.MemoryPointer(mem, i * COUNTER_SLOTS * 4))
        c = _counters[(dev, lane, purpose)]
    return c


def rows2d(x: cp.ndarray) -> tuple[cp.ndarray, int]:
    """x as [rows, last] with a unit last stride, and its row stride in elements (no copy if possible)."""
    if x.ndim == 2 and x.strides[1] == x.itemsize and x.strides[0] % x.itemsize == 0:
        return x, x.strides[0] // x.itemsize
    x = cp.ascontiguousarray(x).reshape(-1, x.shape[-1])
    return x, x.shape[1]


def heads3d(x: cp.ndarray) -> tuple[cp.ndarray, int]:
    """x [T, heads, d] with heads packed inside a token (any token stride), and that stride in elements."""
    it = x.itemsize
    if not (x.strides[2] == it and x.strides[1] == x.shape[2] * it and x.strides[0] % 4 == 0):
        x = cp.ascontiguousarray(x)
    return x, x.strides[0] // it


def as_index(a: Any, dtype: type) -> cp.ndarray:
    """A device index array of `dtype` (host arrays and other int widths are converted)."""
    a = cp.asarray(a)
    return a if a.dtype == dtype else a.astype(dtype)
