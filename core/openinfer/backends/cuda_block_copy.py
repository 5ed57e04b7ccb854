"""The CUDA backend's block copier: pinned host pool, a device->host and a host->device copy stream,
events for landing and ordering.

Saves and restores run on their own streams so a restore overlaps the saves that make room for it
(PCIe moves both directions at once). Ordering, all on the GPU (the engine thread never blocks):
- both copy streams wait for the step stream before each batch, so a copy reads finished KV and
  overwrites no block a queued kernel still reads;
- after a save the step stream waits for it, so the evicted device blocks (handed to a new owner
  at once) are not written before their old contents left;
- a save is issued in chunks, each with an event; a restore chunk waits for the events of the
  saves still reading its device blocks or still filling its host slots.
The host tier never saves into a slot a restore still reads (it pins them until landed), and a
restore is not waited for by the step stream: its request is scheduled once done() says so.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .block_copy import BlockCopier, Pairs, Transfer, runs

CHUNK_BLOCKS = 32   # blocks per save/restore chunk: fine-grained enough to pipeline saves into restores


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
        self._block_saved: dict[int, Any] = {}   # device block -> event of the last save reading it
        self._slot_saved: dict[int, Any] = {}    # host slot -> event of the last save writing it
        with self._device:
            self._d2h = cp.cuda.Stream(non_blocking=True)
            self._h2d = cp.cuda.Stream(non_blocking=True)
            for a in self.dev:
                if not a.flags.c_contiguous:
                    raise ValueError("offloaded state arrays must be C-contiguous")
                shape = (num_host_blocks, *a.shape[1:])
                count = int(np.prod(shape))
                mem = cp.cuda.alloc_pinned_memory(count * a.dtype.itemsize)
                self._pinned.append(mem)   # keeps the page-locked allocation alive
                self.host.append(np.frombuffer(mem, dtype=a.dtype, count=count).reshape(shape))

    def _event(self, stream: Any) -> Any:
        e = self._cp.cuda.Event(block=False, disable_timing=True)
        e.record(stream)
        return e

    def _issue(self, pairs: Pairs, stream: Any, to_host: bool) -> None:
        rt = self._cp.cuda.runtime
        kind = rt.memcpyDeviceToHost if to_host else rt.memcpyHostToDevice
        spans = runs(pairs)
        for dev, host in zip(self.dev, self.host):
            block_bytes = dev.strides[0]
            dbase, hbase = dev.data.ptr, host.ctypes.data
            for d, h, n in spans:
                dptr, hptr = dbase + d * block_bytes, hbase + h * block_bytes
                dst, src = (hptr, dptr) if to_host else (dptr, hptr)
                rt.memcpyAsync(dst, src, n * block_bytes, kind, stream.ptr)

    def save(self, pairs: Pairs) -> Transfer:
        with self._device:
            self._d2h.wait_event(self._event(self._step_stream))
            landed = None
            for i in range(0, len(pairs), CHUNK_BLOCKS):
                chunk = pairs[i:i + CHUNK_BLOCKS]
                self._issue(chunk, self._d2h, to_host=True)
                landed = self._event(self._d2h)
                for d, h in chunk:
                    self._block_saved[d] = self._slot_saved[h] = landed
            if landed is None:
                landed = self._event(self._d2h)
            self._step_stream.wait_event(landed)
        return CudaTransfer(landed)

    def restore(self, pairs: Pairs) -> Transfer:
        with self._device:
            self._h2d.wait_event(self._event(self._step_stream))
            for i in range(0, len(pairs), CHUNK_BLOCKS):
                chunk = pairs[i:i + CHUNK_BLOCKS]
                pending = {id(e): e for d, h in chunk
                           for e in (self._block_saved.pop(d, None), self._slot_saved.get(h)) if e is not None}
                for e in pending.values():
                    if not e.done:
                        self._h2d.wait_event(e)
                self._issue(chunk, self._h2d, to_host=False)
            landed = self._event(self._h2d)
        return CudaTransfer(landed)
