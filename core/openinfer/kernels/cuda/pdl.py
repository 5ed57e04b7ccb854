"""Programmatic dependent launch (PDL): kernel launches through cuLaunchKernelEx with the
programmatic-stream-serialization attribute, which CuPy's RawKernel cannot set.

With it, a kernel may be scheduled while the previous kernel in the stream is still finishing; it
blocks in `griddepcontrol.wait` (pdl_begin() in common.cuh, called before the kernel reads anything the
previous kernel may write; the rule is stated there) until that kernel has completed and its writes are
visible. What this buys is the gap between two kernels: launch latency, CTA ramp-up and the reads a
kernel makes before its wait (weights, earlier tokens' K/V, recurrent state).
A decode step is hundreds of few-microsecond kernels, so the gaps are a large share of it. CUDA
graph capture records the launches as programmatic edges.

Arguments are marshalled the way CuPy does it: a cupy array is its device pointer, a numpy scalar
its own bytes; each one gets an 8-byte slot in a reused buffer (the driver copies the values at
launch, so reuse is safe).

PDL is used for the kernels whose names start with one of KERNELS (the GEMVs and the small kernels between them)
and for a plugin's kernels launched `dependent` (module.launch), in eager steps and in decode graphs of up to the
model's `pdl_decode_rows` (contract/model_line.py; the CUDA backend captures larger ones inside `suspended()`); every
other kernel launches through CuPy. Measured on the H200 in the decode step:
- Qwen3-4B, batch 1: 3.30–3.31 ms with PDL for the small kernels against 3.38–3.40 ms with none, and 3.96 against
  3.70 ms with PDL for every kernel; at batch 32 4.61–4.69 ms with and 4.46–4.47 ms without; at 128 no difference;
- batch 1 with the GEMVs too: 3.27 ms (Qwen3-4B) and 3.14 ms (Qwen3.5-4B) against 3.37 and 3.26 without, once the
  GEMV lets the next kernel launch only after its main loop (gemv.cu); a GEMV that did so at its start took 3.97 ms:
  the next kernel's CTAs then held SM slots through the whole GEMV;
- Qwen3.5-4B, batch 1: its GDN decode kernels (conv_update, gdn_gating, gdn_decode, gated_rms_norm) and the
  attention output gate (sigmoid_gate) on PDL too: 2.90 ms against 3.00 ms without, twice each.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import cupy as cp
import numpy as np

# kernel-name prefixes launched with PDL (then Qwen3.5's GDN decode kernels, then MLA's and the MoE kernels: router,
# routing, grouping, the grouped expert GEMMs (bf16 and quantized; they trigger after their main loop) and combines)
KERNELS = ("gemv", "paged_decode", "rope", "add_rms_norm", "rms_norm",
           "conv_update", "gdn_gating", "gdn_decode", "gated_rms_norm", "sigmoid_gate",
           "mla_", "router_logits", "moe_")
ENABLED = True                # off: every kernel through CuPy (the launch tests and the benches compare both)
MIN_COMPUTE_CAPABILITY = 90   # griddepcontrol is sm_90+
MAX_ARGS = 32
_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_CODES = {"i": "i", "I": "I", "f": "f", "l": "q", "q": "q", "L": "Q", "Q": "Q", "d": "d"}   # numpy char -> struct


class _LaunchAttr(ctypes.Structure):    # CUlaunchAttribute: id, padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttr)), ("num_attrs", ctypes.c_uint)]


_libcuda: ctypes.CDLL | None = None
_supported: dict[int, bool] = {}


def driver() -> ctypes.CDLL:
    """The CUDA driver library (already loaded by CuPy), for the launch CuPy does not wrap."""
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                         ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        lib.cuLaunchKernelEx.restype = ctypes.c_int
        _libcuda = lib
    return _libcuda


class _Suspended(threading.local):
    depth = 0


_suspended = _Suspended()


@contextmanager
def suspended(yes: bool = True) -> Iterator[None]:
    """No PDL for the launches this thread makes inside the block (when `yes`)."""
    _suspended.depth += yes
    try:
        yield
    finally:
        _suspended.depth -= yes


def enabled(kernel: str = "") -> bool:
    """PDL is on for this kernel name (it starts with one of KERNELS) and available()."""
    return kernel.startswith(KERNELS) and available()


def available() -> bool:
    """A launch may take PDL now: it is on, not suspended on this thread, the current device has it (sm_90+) and the
    current stream is not the legacy default stream (whose implicit synchronisation PDL does not promise to keep).
    Kernels outside KERNELS that keep common.cuh's rule (a plugin's, launched with `dependent=True`) take it then."""
    if not ENABLED or _suspended.depth or cp.cuda.get_current_stream().ptr == 0:
        return False
    dev = cp.cuda.Device().id
    if dev not in _supported:
        _supported[dev] = int(cp.cuda.Device(dev).compute_capability) >= MIN_COMPUTE_CAPABILITY
    return _supported[dev]


class _Slots(threading.local):
    """Per-thread launch state: the argument buffer, pointers to its slots, the attribute and config."""

    def __init__(self) -> None:
        self.buf = ctypes.create_string_buffer(8 * MAX_ARGS)
        base = ctypes.addressof(self.buf)
        self.params = (ctypes.c_void_p * MAX_ARGS)(*[base + 8 * i for i in range(MAX_ARGS)])
        self.attrs = (_LaunchAttr * 2)()
        self.cfg = _LaunchConfig()
        self.cfg.attrs = ctypes.cast(self.attrs, ctypes.POINTER(_LaunchAttr))


_slots = _Slots()


def pack(args: tuple) -> tuple[list[str], list[Any]]:
    """The struct codes and values of a kernel's arguments: a numpy scalar at its own size, a device
    array as its 64-bit pointer."""
    fmt, values = [], []
    for a in args:
        if isinstance(a, np.generic):
            if a.dtype.char not in _CODES:
                raise TypeError(f"kernel argument {a!r}: a {a.dtype} scalar; pass an integer or float one")
            fmt.append(_CODES[a.dtype.char])
            values.append(a.item())
        else:   # a device array (anything with CuPy's .data.ptr)
            fmt.append("Q")
            values.append(a.data.ptr)
    return fmt, values


def launch(function_ptr: int, grid: Sequence[int], block: int, args: tuple, smem: int, pdl_on: bool = True,
           cluster: tuple[int, int, int] | None = None) -> None:
    """Launch the CUfunction at `function_ptr` on the current stream through cuLaunchKernelEx: with PDL
    (`pdl_on`) and/or in thread-block clusters of `cluster` CTAs (x, y, z), which CuPy cannot set either."""
    if len(args) > MAX_ARGS:
        raise ValueError(f"{len(args)} kernel arguments, at most {MAX_ARGS}")
    s = _slots
    codes, values = pack(args)
    struct.pack_into("<" + "".join(c if c in "qQd" else c + "4x" for c in codes), s.buf, 0, *values)  # 8-byte slots
    cfg = s.cfg
    g = tuple(grid) + (1, 1)
    cfg.grid[0], cfg.grid[1], cfg.grid[2] = int(g[0]), int(g[1]), int(g[2])
    cfg.block[0], cfg.block[1], cfg.block[2] = block, 1, 1
    cfg.smem = smem
    cfg.stream = cp.cuda.get_current_stream().ptr
    n = 0
    if pdl_on:
        s.attrs[n].id = _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        s.attrs[n].value[0] = 1   # programmaticStreamSerializationAllowed
        n += 1
    if cluster:
        s.attrs[n].id = _CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        s.attrs[n].value[0], s.attrs[n].value[1], s.attrs[n].value[2] = (int(c) for c in cluster)
        n += 1
    cfg.num_attrs = n
    status = driver().cuLaunchKernelEx(ctypes.byref(cfg), function_ptr, s.params, None)
    if status:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {status} (grid {tuple(grid)}, block {block}, "
                           f"{smem} bytes of shared memory, PDL {pdl_on}, cluster {cluster})")


def max_active_clusters(function_ptr: int, block: int, smem: int, cluster: int) -> int:
    """How many clusters of `cluster` CTAs (along x) of the CUfunction at `function_ptr` the device runs at once
    (cuOccupancyMaxActiveClusters: an SM's registers and shared memory and how the SMs group into GPCs count)."""
    lib = driver()
    fn = lib.cuOccupancyMaxActiveClusters
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(_LaunchConfig)]
    fn.restype = ctypes.c_int
    attr = (_LaunchAttr * 1)()
    attr[0].id = _CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr[0].value[0], attr[0].value[1], attr[0].value[2] = cluster, 1, 1
    cfg = _LaunchConfig()
    cfg.grid[0], cfg.grid[1], cfg.grid[2] = cluster, 1, 1
    cfg.block[0], cfg.block[1], cfg.block[2] = block, 1, 1
    cfg.smem = smem
    cfg.attrs = ctypes.cast(attr, ctypes.POINTER(_LaunchAttr))
    cfg.num_attrs = 1
    n = ctypes.c_int(0)
    status = fn(ctypes.byref(n), function_ptr, ctypes.byref(cfg))
    if status:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed with CUresult {status} (clusters of {cluster}, "
                           f"block {block}, {smem} bytes of shared memory)")
    return n.value
