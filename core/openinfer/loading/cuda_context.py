"""The GPU's CUDA context, created early on a thread while the interpreter imports and parses.

The driver takes ~0.3 s to create a context. Python threads only overlap where the GIL is
released: CuPy's runtime calls that create it (cudaGetDeviceCount, cudaSetDevice) hold the GIL,
and so does every import, but ctypes releases the GIL during a foreign call. So here the driver API retains device N's primary context through ctypes; the
CUDA runtime (CuPy) finds it ready later. The extra reference lives as long as the process, as
the context would anyway. Any failure is only logged: the CUDA backend reports a missing driver
or device properly when it starts.
"""
from __future__ import annotations

import ctypes
import logging
from concurrent.futures import Future

from .phases import in_background

log = logging.getLogger("openinfer.loading.cuda_context")


def retain_primary_context(index: int) -> bool:
    """cuInit + cuDevicePrimaryCtxRetain for device `index`; False (and a log line) if that failed."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        log.info("no early CUDA context: no driver library (%s)", e)
        return False
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    for name, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), index)),
                       ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), dev))):
        status = getattr(driver, name)(*args)
        if status:
            log.info("no early CUDA context: %s returned CUresult %d", name, status)
            return False
    return True


def create_context_early(device: str) -> Future[bool] | None:
    """For --device cuda or cuda:N, start creating that GPU's context on a thread; None for other devices."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return None
    return in_background(f"CUDA context (driver API, cuda:{index or 0})", retain_primary_context, int(index or 0))
