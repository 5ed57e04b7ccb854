"""CPU check of CUDA kernel launches against the kernels' compiled parameter lists (no GPU).

Each .cu (a core source's name or a plugin's path, as compile.source_path takes) is compiled by
NVRTC to PTX, whose `.entry` lists give every kernel's parameters with their sizes (.u64: a
pointer or a 64-bit integer, .u32/.s32: a 32-bit integer, .f32: a float). The launchers run on
host stand-ins for cupy arrays (numpy arrays with a `.data.ptr`) with `launch` recording instead
of launching, and each launch is checked as it is recorded: the argument count, each argument's
size, floats where the kernel takes a float, no Python int or float (CuPy would pass it at a
size of its choosing), the 8-byte slots a programmatic dependent launch packs (pdl.py), that a kernel launched
`dependent` waits in griddepcontrol, and the grid, block, shared-memory and cluster limits of sm_90. A wrong argument
tuple otherwise shows only on a GPU, as a crash or garbage."""
from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..kernels.cuda import compile as kc
from ..kernels.cuda import module, pdl
from .cuda import require_nvrtc

PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+\w+(?:\[(\d+)\])?")
SMEM_MAX = 227 * 1024   # the opt-in ceiling of dynamic shared memory per block on sm_90
THREADS_MAX = 1024
CLUSTER_MAX = 8         # CTAs in a thread-block cluster without the non-portable opt-in


class FakeArray(np.ndarray):
    """A host array standing in for a cupy array: `.data.ptr` is its address."""

    @property
    def data(self) -> SimpleNamespace:  # type: ignore[override]
        return SimpleNamespace(ptr=self.__array_interface__["data"][0])


def aligned_empty(shape: int | Sequence[int], dtype: Any = np.float32) -> FakeArray:
    """Like cupy's allocations: 256-byte aligned, so the launchers take their vectorized paths."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + 256, np.uint8)
    off = -raw.ctypes.data % 256
    return raw[off: off + n].view(dtype).reshape(shape).view(FakeArray)


def fake(a: Any, dtype: Any = None) -> FakeArray:
    """cupy.asarray on the host: a FakeArray of `dtype` is returned as is (no copy), anything else copied."""
    if isinstance(a, FakeArray) and (dtype is None or a.dtype == np.dtype(dtype)):
        return a
    a = np.asarray(a, dtype)
    out = aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out


def _ascontiguousarray(a: Any, dtype: Any = None) -> Any:
    """A packed array of `dtype` is returned as is (a host one too, which check_launch then rejects)."""
    return a if a.flags.c_contiguous and dtype in (None, a.dtype) else fake(np.ascontiguousarray(a), dtype)


# The part of the cupy namespace the launchers use, on FakeArrays.
FAKE_CP = SimpleNamespace(empty=aligned_empty, asarray=fake, ascontiguousarray=_ascontiguousarray, asnumpy=np.array,
                          float32=np.float32, int32=np.int32, int64=np.int64, uint8=np.uint8, ndarray=FakeArray)


def nvrtc_compiled(source: str | Path, options: Sequence[str], read: Callable[[Any, Any], Any]) -> Any:
    """`read(nvrtc, program)` (its PTX, its log, ...) once NVRTC compiled `source`, as compile.source_path takes it,
    with the kernels' options and `options`."""
    nvrtc = kc._nvrtc()
    path = kc.source_path(source)
    headers = kc._headers(path.parent)
    prog = nvrtc.createProgram(path.read_text(), path.name, [h.encode() for h in headers.values()],
                               [n.encode() for n in headers])
    try:
        nvrtc.compileProgram(prog, [*kc.OPTIONS, *options])
        return read(nvrtc, prog)
    finally:
        nvrtc.destroyProgram(prog)


@functools.lru_cache(maxsize=None)
def ptx_entries(source: str | Path) -> dict[str, tuple[str, str]]:
    """kernel name -> (its PTX parameter list, its PTX body), for `source` as compile.source_path takes it."""
    ptx = nvrtc_compiled(source, ["-arch=compute_90a"], lambda nvrtc, prog: nvrtc.getPTX(prog).decode())
    heads = list(re.finditer(r"\.entry\s+(\w+)\s*\(([^)]*)\)", ptx))
    ends = [h.start() for h in heads[1:]] + [len(ptx)]
    return {h.group(1): (h.group(2), ptx[h.end():end]) for h, end in zip(heads, ends)}


def entries(source: str | Path) -> dict[str, list[tuple[str, int]]]:
    """kernel name -> [(PTX type, bytes)] of its parameters, for `source` as compile.source_path takes it."""
    return {name: [(t, int(n) if n else int(re.sub(r"\D", "", t) or 8) // 8) for t, n in PARAM.findall(params)]
            for name, (params, _) in ptx_entries(source).items()}


@dataclass(frozen=True)
class Launch:
    """One recorded `launch(source, name, grid, block, args, smem, cluster, dependent)` call."""
    source: str | Path
    name: str
    grid: tuple[int, ...]
    block: int
    args: tuple
    smem: int = 0
    cluster: tuple[int, int, int] | None = None
    dependent: bool = False


def check_launch(call: Launch) -> None:
    """Assert that `call` matches its kernel's PTX parameter list and the launch limits of sm_90."""
    name, args = call.name, call.args
    params = entries(call.source)[name]
    if call.dependent:   # launched with PDL outside pdl.KERNELS: it must wait before it reads the previous output
        assert "griddepcontrol.wait" in ptx_entries(call.source)[name][1], f"{name}: launched dependent, never waits"
    assert len(args) == len(params), f"{name}: {len(args)} arguments for {len(params)} parameters"
    for i, (a, (ptype, size)) in enumerate(zip(args, params)):
        where = f"{name} argument {i} ({ptype})"
        if isinstance(a, np.ndarray):
            assert isinstance(a, FakeArray) and ptype in ("u64", "b64", "s64"), f"{where}: an array"
        else:
            assert isinstance(a, np.generic), f"{where}: {type(a).__name__} {a!r} (pass a numpy scalar)"
            assert a.dtype.itemsize == size, f"{where}: {a.dtype} is {a.dtype.itemsize} bytes"
            assert (a.dtype.kind == "f") == ptype.startswith("f"), f"{where}: {a.dtype}"
    codes, _ = pdl.pack(args)   # what a programmatic dependent launch packs into each argument slot
    for i, code in enumerate(codes):
        assert struct.calcsize("<" + code) == params[i][1], f"{name} argument {i}: packed as {code} under PDL"
    grid = call.grid + (1,) * (3 - len(call.grid))
    assert all(isinstance(g, int) and g >= 1 for g in grid), f"{name}: grid {grid}"
    assert grid[0] < 2**31 and grid[1] <= 65535 and grid[2] <= 65535, f"{name}: grid {grid}"
    assert 1 <= call.block <= THREADS_MAX and call.block % 32 == 0, f"{name}: block {call.block}"
    assert call.smem <= SMEM_MAX, f"{name}: {call.smem} bytes of shared memory"
    if call.cluster is not None:
        assert len(call.cluster) == 3 and all(g % c == 0 for g, c in zip(grid, call.cluster)), \
            f"{name}: grid {grid} is not whole clusters of {call.cluster}"
        assert 1 < int(np.prod(call.cluster)) <= CLUSTER_MAX, f"{name}: cluster {call.cluster}"


def record_launches(monkeypatch: Any, modules: Iterable[ModuleType]) -> list[Launch]:
    """Put FAKE_CP in place of each module's `cp` and a checking recorder in place of its `launch`
    (where it has one), the core's kernel module (kernels/cuda/module.py) always among them, with PDL reported off,
    through pytest's `monkeypatch`; returns the list the checked launches land in."""
    require_nvrtc()
    recorded: list[Launch] = []

    def launch(source: str | Path, name: str, grid: Sequence[int], block: int, args: tuple, smem: int = 0,
               cluster: tuple[int, int, int] | None = None, dependent: bool = False) -> None:
        call = Launch(source, name, tuple(int(g) for g in grid), block, args, smem, cluster, dependent)
        check_launch(call)
        recorded.append(call)

    monkeypatch.setattr(pdl, "available", lambda: False)   # it asks the (absent) GPU
    for mod in (*modules, module):
        monkeypatch.setattr(mod, "cp", FAKE_CP)
        if hasattr(mod, "launch"):
            monkeypatch.setattr(mod, "launch", launch)
    return recorded
