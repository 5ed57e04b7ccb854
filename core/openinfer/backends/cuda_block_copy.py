"""The CUDA backend's block copier: pinned host pool, one copy stream, events for landing.

Ordering, all on the GPU (the engine thread never blocks on a copy):
- the copy stream waits for the step stream before each batch, so it reads finished KV and
  overwrites no block a queued kernel still reads;
- after a save the step stream waits for the save's event, so the evicted device blocks (handed
  to a new owner at once) are not written before their old contents left;
- one copy stream, so batches land in issue order (save -> restore of the same slot, restore ->
  save into a reused slot).
A restore is not waited for by the step stream: its request is scheduled only once done() says
the batch landed.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .block_copy import BlockCopier, Pairs, Transfer, runs


class CudaTransfer(Transfer):
    def __init__(self, event: Any) -> None:
        self.event = event

    def done(self) -> bool:
        return bool(self.event.done)

    def wait(self) -> None:
        self.event.synchronize()


class CudaBlockCopier(BlockCopier):
    def __init__(self, backend: Any, device_arrays: Sequence[Any], num_host_blocks: int) -> None:
        cp = backend.xp
        self._cp, self._device, self._step_stream = cp, backend.device, backend.stream
        self.dev = list(device_arrays)
        self.host, self._pinned = [], []
        with self._device:
            self._stream = cp.cuda.Stream(non_blocking=True)
            for a in self.dev:
                if not a.flags.c_contiguous:
                    raise ValueError("offloaded state arrays must be C-contiguous")
                shape = (num_host_blocks, *a.shape[1:])
                count = int(np.prod(shape))
                mem = cp.cuda.alloc_pinned_memory(count * a.dtype.itemsize)
                self._pinned.append(mem)   # keeps the page-locked allocation alive
                self.host.append(np.frombuffer(mem, dtype=a.dtype, count=count).reshape(shape))

    def _copy(self, pairs: Pairs, to_host: bool) -> CudaTransfer:
        cp = self._cp
        rt = cp.cuda.runtime
        kind = rt.memcpyDeviceToHost if to_host else rt.memcpyHostToDevice
        spans = runs(pairs)
        with self._device:
            ready = cp.cuda.Event(block=False, disable_timing=True)
            ready.record(self._step_stream)
            self._stream.wait_event(ready)
            for dev, host in zip(self.dev, self.host):
                block_bytes = dev.strides[0]
                dbase, hbase = dev.data.ptr, host.ctypes.data
                for d, h, n in spans:
                    dptr, hptr = dbase + d * block_bytes, hbase + h * block_bytes
                    dst, src = (hptr, dptr) if to_host else (dptr, hptr)
                    rt.memcpyAsync(dst, src, n * block_bytes, kind, self._stream.ptr)
            landed = cp.cuda.Event(block=False, disable_timing=True)
            landed.record(self._stream)
            if to_host:
                self._step_stream.wait_event(landed)
        return CudaTransfer(landed)

    def save(self, pairs: Pairs) -> Transfer:
        return self._copy(pairs, to_host=True)

    def restore(self, pairs: Pairs) -> Transfer:
        return self._copy(pairs, to_host=False)
