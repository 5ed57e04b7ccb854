"""Decode steps as CUDA graphs: captured once per batch-size bucket at start-up, replayed per step.

A decode step is one token per sequence, so its shape is the bucket size alone. Every input lives
in static device buffers (graph_inputs.py: one int32 array, plus the block table) that a replay
reads; a step writes its values into a pinned host mirror and uploads it with two copies. Padding
rows compute a throw-away token whose K/V lands in the reserved block 0 and whose bounded state
(hybrid models) lands in the reserved state row 0. The attention grid is sized for the longest
context (`max_model_len`); the kernel divides each sequence's own length. State pools are
allocated once at load, so the state rows a graph addresses stay put.

Intermediates are allocated from a memory pool of the graphs' own, kept for their lifetime: a
buffer baked into a graph must never be handed to anything else. Graphs share that pool because
they never run at the same time.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..engine.batch import ForwardBatch
from .graph_inputs import WORDS, GraphInputs

if TYPE_CHECKING:
    from ..engine.model_runner import HostBatch

log = logging.getLogger("openinfer.cuda_graphs")
Forward = Callable[[ForwardBatch], tuple[Any, Any]]   # batch -> (logits [B, V], greedy tokens [B] int32)


def buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 to 64 and 16 beyond: a padded row costs little, a graph ~10 ms."""
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs]
    b = 8
    while b < max_num_seqs:
        sizes.append(b)
        b += 8 if b < 64 else 16
    return sizes + [max_num_seqs]


class DecodeGraphs:
    def __init__(self, cp: Any, stream: Any, forward: Forward, max_num_seqs: int, max_model_len: int,
                 block_size: int, state_slots: bool = False) -> None:
        """`state_slots`: the model has bounded per-request state (its batches carry state_slots)."""
        self.cp, self.stream, self.forward = cp, stream, forward
        self.sizes = buckets(max_num_seqs)
        self.block_size, self.max_model_len, self.state_slots = block_size, max_model_len, state_slots
        n = self.sizes[-1]
        width = -(-max_model_len // block_size)
        self._host_mem = cp.cuda.alloc_pinned_memory(WORDS * n * 4)
        self._tables_mem = cp.cuda.alloc_pinned_memory(n * width * 4)
        self.inputs = GraphInputs(cp, n, width, self._host_mem, self._tables_mem)
        self.pool = cp.cuda.MemoryPool()
        self.device = cp.cuda.Device()   # the current one: decode_graphs builds us under the backend's
        # recorded after each upload: the mirrors are restaged only once the last upload has read them
        # (a pipelined engine stages step N+1 while step N's upload may still be queued)
        self._uploaded = cp.cuda.Event(disable_timing=True)
        self._fetched = cp.cuda.alloc_pinned_memory(n * 8)   # `fetch`'s landing buffer
        self._fetch_done = cp.cuda.Event(disable_timing=True)
        self.graphs: dict[int, tuple[Any, Any, Any]] = {}   # bucket -> (graph, logits, tokens)

    def capture(self) -> None:
        """Capture every bucket, largest first (its intermediates size the shared pool).

        The host never waits for the GPU before the end: the capture stream waits on an event for
        the step stream's queued work (the input upload, and the KV pools' zero fill, ~120 GB on an
        H200) while Python captures. Only the largest bucket runs eagerly first, outside capture:
        that loads the kernels the activation profile did not (attention at the graphs' full
        width) and grows the shared pool to the largest intermediates, which smaller buckets reuse
        (the pool splits its free blocks), and sets up the kernels' per-device state (cuBLAS handle,
        arrival counters of split GEMV and decode attention) if the activation profile has not."""
        cp, t0 = self.cp, time.perf_counter()
        self._upload(self.inputs.clear())
        queued = cp.cuda.Event(disable_timing=True)
        queued.record(self.stream)
        capture_stream = cp.cuda.Stream(non_blocking=True)
        capture_stream.wait_event(queued)
        with cp.cuda.using_allocator(self.pool.malloc), capture_stream:
            for b in reversed(self.sizes):
                batch = self.inputs.batch(b, self.block_size, self.max_model_len, self.state_slots)
                if b == self.sizes[-1]:
                    self.forward(batch)
                capture_stream.begin_capture()
                logits, tokens = self.forward(batch)
                graph = capture_stream.end_capture()
                self.graphs[b] = (graph, logits, tokens)
        capture_stream.synchronize()
        log.info("captured %d decode CUDA graphs (batch %s) in %.2f s, %.1f MiB of graph memory",
                 len(self.graphs), ",".join(map(str, self.sizes)), time.perf_counter() - t0,
                 self.pool.total_bytes() / 2**20)

    def bucket(self, num_seqs: int) -> int | None:
        return next((b for b in self.sizes if b >= num_seqs), None)

    def _upload(self, width: int) -> None:
        """The host mirrors to the static buffers on the step stream (`width` table columns)."""
        cp, x = self.cp, self.inputs
        x.meta.data.copy_from_host_async(x.host.ctypes.data, x.host.nbytes, self.stream)
        cp.cuda.runtime.memcpy2DAsync(x.tables.data.ptr, x.width * 4, x.host_tables.ctypes.data, x.width * 4,
                                      width * 4, x.n, cp.cuda.runtime.memcpyHostToDevice, self.stream.ptr)

    def replay(self, h: HostBatch, ids: Any = None) -> tuple[Any, Any]:
        """Run one decode step (h: one token per sequence); returns the bucket's (logits, tokens)
        device arrays, valid until the next replay (rows past the batch are padding). `ids`: a
        device array of the step's token ids, replacing h's (the previous replay's tokens, read on
        the device before this replay overwrites them)."""
        graph, logits, out = self.graphs[self.bucket(len(h.token_ids))]
        self._uploaded.synchronize()
        self._upload(self.inputs.stage(h))
        self._uploaded.record(self.stream)
        if ids is not None:
            with self.device, self.stream:
                self.inputs.ids(len(ids))[...] = ids
        graph.launch(self.stream)
        return logits, out

    def fetch(self, tokens: Any) -> Callable[[], np.ndarray]:
        """Queue a replay's tokens to the host now, before the next replay overwrites them; the
        returned call waits for that copy alone, not for the replays queued after it (a pipelined
        engine collects step N while step N+1 runs). One fetch is outstanding at a time."""
        host = np.frombuffer(self._fetched, tokens.dtype, tokens.size)
        self.cp.cuda.runtime.memcpyAsync(host.ctypes.data, tokens.data.ptr, tokens.nbytes,
                                         self.cp.cuda.runtime.memcpyDeviceToHost, self.stream.ptr)
        self._fetch_done.record(self.stream)

        def wait() -> np.ndarray:
            self._fetch_done.synchronize()
            return host.copy()
        return wait
