"""The CUDA backend's block copier: pinned host pool, a device->host and a host->device copy stream,
events for landing and ordering.

Saves and restores run on their own streams so a restore overlaps the saves (PCIe moves both
directions at once). Ordering, all on the GPU (the engine thread never blocks):
- both copy streams wait for the step stream before each batch, so a copy reads finished KV and
  overwrites no block a queued kernel still reads;
- a save orders nothing after it: its blocks stay in the prefix cache, unwritten. reuse(blocks)
  makes the step stream wait for the saves still reading those blocks, when they are handed to a
  new owner; only the pending ones are waited for, so blocks saved ahead of eviction cost nothing;
- a save is issued in chunks, each with an event; a restore chunk waits for the events of the
  saves still reading its device blocks or still filling its host slots, and for nothing else,
  so a restore into freshly evicted blocks pipelines behind their saves instead of queueing
  after all of them (a restore queued after a reuse() of blocks still being saved does wait for
  those saves, through the step stream; the host tier's saving ahead keeps such reuses rare).
The host tier never saves into a slot a restore still reads (it pins them until landed), and a
restore is not waited for by the step stream: its request is scheduled once done() says so.
Each batch is one cudaMemcpyAsync per array per run of consecutive blocks (block_copy.runs): a
block holds every layer of its part, so a run of n blocks is one n * ~1 MB copy, large enough
for the copy engine to run at PCIe speed.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .block_copy import BlockCopier, Pairs, Transfer, runs

CHUNK_BLOCKS = 32   # blocks per save/restore chunk: fine-grained enough to pipeline saves into restores


class CudaTransfer(Transfer):
    def __init__(self, event: Any, start: Any = None, elapsed: Any = None) -> None:
        self.event, self.start, self._elapsed = event, start, elapsed

    def done(self) -> bool:
        return bool(self.event.done)

    def wait(self) -> None:
        self.event.synchronize()

    def copy_ms(self) -> float | None:
        if self.start is None or not self.done():
            return None
        return float(self._elapsed(self.start, self.event))


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

    def _event(self, stream: Any, timing: bool = False) -> Any:
        e = self._cp.cuda.Event(block=False, disable_timing=not timing)
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
        return CudaTransfer(landed)

    def reuse(self, blocks: Sequence[int]) -> None:
        pending = {id(e): e for e in (self._block_saved.pop(b, None) for b in blocks)
                   if e is not None and not e.done}
        with self._device:
            for e in pending.values():
                self._step_stream.wait_event(e)

    def restore(self, pairs: Pairs) -> Transfer:
        with self._device:
            self._h2d.wait_event(self._event(self._step_stream))
            start = self._event(self._h2d, timing=True)
            for i in range(0, len(pairs), CHUNK_BLOCKS):
                chunk = pairs[i:i + CHUNK_BLOCKS]
                pending = {id(e): e for d, h in chunk
                           for e in (self._block_saved.pop(d, None), self._slot_saved.get(h)) if e is not None}
                for e in pending.values():
                    if not e.done:
                        self._h2d.wait_event(e)
                self._issue(chunk, self._h2d, to_host=False)
            landed = self._event(self._h2d, timing=True)
        return CudaTransfer(landed, start, self._cp.cuda.get_elapsed_time)
