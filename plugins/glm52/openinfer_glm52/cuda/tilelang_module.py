"""The TileLang-built kernels of tilelang/ (cubins for sm_90a made by kernels_src/build_tilelang.py, beside their
.cu sources and launch metadata in kernels.json): loaded through CuPy's module loader and launched with their
arguments given by parameter name, which kernels.json puts in the compiled order. Serving needs neither tilelang
nor torch; the cubins load only on an sm_90 GPU."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import cupy as cp
import ml_dtypes
import numpy as np

from openinfer.plugin_api.cuda import pdl

KERNEL_DIR = Path(__file__).with_name("tilelang")
_DEFAULT_SMEM = 48 * 1024   # above this a kernel must opt in to more dynamic shared memory
_DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16)}
_modules: dict[tuple[int, str], Any] = {}     # kept alive with their functions
_functions: dict[tuple[int, str], Any] = {}


@functools.cache
def kernels() -> dict[str, dict]:
    """kernel name -> its metadata: params [{name, type}] in compiled order ("ptr:<dtype>", "int32" or
    "float32"), block [x, y, z], smem (bytes of dynamic shared memory), grid (TileLang's expressions), pdl (the
    kernel waits in griddepcontrol first: it may take programmatic dependent launch)."""
    return json.loads((KERNEL_DIR / "kernels.json").read_text())["kernels"]


def _dtype(name: str) -> np.dtype:
    return _DTYPES.get(name) or np.dtype(name)


def arguments(name: str, values: Mapping[str, Any]) -> tuple:
    """The argument tuple of kernel `name` in its compiled order from `values` by parameter name: arrays checked
    against each pointer's element type, scalars as numpy scalars of the parameter's type."""
    params = kernels()[name]["params"]
    names = [p["name"] for p in params]
    if sorted(values) != sorted(names):
        raise TypeError(f"{name}: takes {', '.join(names)}; got {', '.join(sorted(values))}")
    args = []
    for p in params:
        v, kind = values[p["name"]], p["type"]
        if kind.startswith("ptr:"):
            if v.dtype != _dtype(kind[4:]):
                raise TypeError(f"{name}: {p['name']} must be {kind[4:]}, not {v.dtype}")
            args.append(v)
        else:
            args.append(_dtype(kind).type(v))
    return tuple(args)


def _function(name: str) -> Any:
    dev = cp.cuda.Device().id
    fn = _functions.get((dev, name))
    if fn is None:
        module = _modules[(dev, name)] = cp.RawModule(path=str(KERNEL_DIR / f"{name}.cubin"))
        fn = module.get_function(name)
        smem = kernels()[name]["smem"]
        if smem > _DEFAULT_SMEM:
            fn.max_dynamic_shared_size_bytes = smem
        _functions[(dev, name)] = fn
    return fn


def launch(name: str, grid: Sequence[int], values: Mapping[str, Any]) -> None:
    """Launch TileLang kernel `name` on the current stream (so CUDA-graph capture sees it) with its block and
    shared memory from kernels.json and `values` by parameter name; with programmatic dependent launch where
    kernels.json says the kernel waits for it (it then starts while the previous kernel drains) and it is
    available (plugin_api.cuda.pdl)."""
    meta = kernels()[name]
    fn, args, grid = _function(name), arguments(name, values), tuple(int(g) for g in grid)
    block = tuple(meta["block"])
    if meta["pdl"] and block[1:] == (1, 1) and pdl.available():
        pdl.launch(fn.kernel.ptr, grid, block[0], args, meta["smem"])
    else:
        fn(grid, block, args, shared_mem=meta["smem"])
