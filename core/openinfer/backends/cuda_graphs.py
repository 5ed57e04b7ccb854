"""Decode steps as CUDA graphs: captured once per batch-size bucket at start-up, replayed per step.

A decode step is one token per sequence, so its shape is the bucket size alone. Every input lives
in static device buffers (views of one int32 array, plus the block table) that a replay reads; a
step writes its values into one pinned host mirror and uploads it with two copies. Padding rows
compute a throw-away token whose K/V lands in the reserved block 0. The attention grid is sized
for the longest context (`max_model_len`); the kernel divides each sequence's own length.

Intermediates are allocated from a memory pool of the graphs' own, kept for their lifetime: a
buffer baked into a graph must never be handed to anything else. Graphs share that pool because
they never run at the same time.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

import numpy as np

from ..batch import ForwardBatch

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
                 block_size: int) -> None:
        self.cp, self.stream, self.forward = cp, stream, forward
        self.sizes = buckets(max_num_seqs)
        self.block_size, self.max_model_len = block_size, max_model_len
        n = self.max_b = self.sizes[-1]
        self.width = -(-max_model_len // block_size)
        # host mirror [slot_mapping (int64, as 2 int32, first: 8-byte aligned) | tokens | positions | context_lens]
        self._host_mem = cp.cuda.alloc_pinned_memory(5 * n * 4)
        self.host = np.frombuffer(self._host_mem, np.int32, 5 * n)
        self._tables_mem = cp.cuda.alloc_pinned_memory(n * self.width * 4)
        self.host_tables = np.frombuffer(self._tables_mem, np.int32, n * self.width).reshape(n, self.width)
        self.meta = cp.zeros(5 * n, dtype=cp.int32)
        self.tables = cp.zeros((n, self.width), dtype=cp.int32)
        self.arange = cp.arange(n + 1, dtype=cp.int32)   # query starts and sample rows: one token a row
        self.pool = cp.cuda.MemoryPool()
        self.graphs: dict[int, tuple[Any, Any, Any]] = {}   # bucket -> (graph, logits, tokens)

    def _batch(self, b: int) -> ForwardBatch:
        n, m = self.max_b, self.meta
        return ForwardBatch(
            slot_mapping=m[: 2 * n].view(self.cp.int64)[:b], token_ids=m[2 * n: 2 * n + b],
            positions=m[3 * n: 3 * n + b], context_lens=m[4 * n: 4 * n + b], block_tables=self.tables[:b],
            query_start=self.arange[: b + 1], sample_rows=self.arange[:b],
            query_start_host=np.arange(b + 1, dtype=np.int32), context_lens_host=np.ones(b, np.int32),
            block_size=self.block_size, max_query_len=1, max_context_len=self.max_model_len)

    def capture(self) -> None:
        """Capture every bucket, largest first (its intermediates size the shared pool)."""
        cp, t0 = self.cp, time.perf_counter()
        self._stage(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int32),
                    np.zeros((0, 1), np.int32))
        self.stream.synchronize()
        capture_stream = cp.cuda.Stream(non_blocking=True)
        with cp.cuda.using_allocator(self.pool.malloc), capture_stream:
            for b in reversed(self.sizes):
                batch = self._batch(b)
                self.forward(batch)          # eager first: kernels load, the pool grows outside capture
                capture_stream.synchronize()
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

    def _stage(self, tokens: np.ndarray, positions: np.ndarray, slots: np.ndarray, ctx: np.ndarray,
               tables: np.ndarray) -> None:
        """Write a step's inputs into the host mirror (padding rows: token 0, slot 0, context 1 in
        block 0) and upload them on the step stream."""
        n, B = self.max_b, len(tokens)
        h = self.host
        h[:] = 0
        h[: 2 * n].view(np.int64)[:B] = slots
        h[2 * n: 2 * n + B], h[3 * n: 3 * n + B], h[4 * n: 4 * n + B] = tokens, positions, ctx
        h[4 * n + B: 5 * n] = 1
        width = max(1, tables.shape[1])
        self.host_tables[B:n, :width] = 0   # padding rows: block 0 (the batch's rows are overwritten whole)
        self.host_tables[:B, : tables.shape[1]] = tables
        cp = self.cp
        self.meta.data.copy_from_host_async(self.host.ctypes.data, self.host.nbytes, self.stream)
        cp.cuda.runtime.memcpy2DAsync(self.tables.data.ptr, self.width * 4, self.host_tables.ctypes.data,
                                      self.width * 4, width * 4, n, cp.cuda.runtime.memcpyHostToDevice,
                                      self.stream.ptr)

    def replay(self, tokens: np.ndarray, positions: np.ndarray, slots: np.ndarray, ctx: np.ndarray,
               tables: np.ndarray) -> tuple[Any, Any]:
        """Run one decode step of len(tokens) sequences; returns the bucket's (logits, tokens) device
        arrays, valid until the next replay (rows past the batch are padding)."""
        b = self.bucket(len(tokens))
        graph, logits, out = self.graphs[b]
        self._stage(tokens, positions, slots, ctx, tables)
        graph.launch(self.stream)
        return logits, out
