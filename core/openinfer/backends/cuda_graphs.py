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

A mixed step (decode rows and prompt runs) may replay its decode rows' graph on the graphs' own stream beside the
prompts' eager forward on the step stream (`replay_beside`; when, and what it measured: model_runner.py,
BESIDE_READ_RATIO). So the graphs capture in a lane of their own (kernels/cuda/lanes.py): the cuBLAS workspace and
arrival counters they bake in are not the ones an eager forward uses.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..engine.batch import ForwardBatch
from ..kernels.cuda import lanes
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
                 block_size: int, state_slots: bool = False, lane: str = lanes.GRAPHS) -> None:
        """`state_slots`: the model has bounded per-request state (its batches carry state_slots). `lane`: the
        kernel lane the graphs capture in (their backend's graphs lane, lanes.graphs_of)."""
        self.cp, self.stream, self.forward, self.lane = cp, stream, forward, lane
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
        # the graphs' own stream: capture, and the replays beside an eager forward; kept for the graphs' lifetime, so
        # no later stream takes its handle (lanes are by name, but a stream's address must not come back as another's)
        self.side = cp.cuda.Stream(non_blocking=True)
        self._queued = cp.cuda.Event(disable_timing=True)    # the step stream's work before a replay beside
        self._replayed = cp.cuda.Event(disable_timing=True)  # that replay's end, which the step stream waits for

    def capture(self) -> None:
        """Capture every bucket, largest first (its intermediates size the shared pool).

        The host never waits for the GPU before the end: the capture stream waits on an event for
        the step stream's queued work (the input upload, and the KV pools' zero fill, ~120 GB on an
        H200) while Python captures. Only the largest bucket runs eagerly first, outside capture:
        that loads the kernels the activation profile did not (attention at the graphs' full
        width) and grows the shared pool to the largest intermediates, which smaller buckets reuse
        (the pool splits its free blocks), and sets up the graphs lane's kernel state (cuBLAS handle and
        workspace, arrival counters of split decode attention and the fused router)."""
        cp, t0 = self.cp, time.perf_counter()
        self._upload(self.inputs.clear())
        queued = cp.cuda.Event(disable_timing=True)
        queued.record(self.stream)
        capture_stream = self.side
        capture_stream.wait_event(queued)
        with cp.cuda.using_allocator(self.pool.malloc), capture_stream, lanes.lane(self.lane):
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

    def _upload(self, width: int, stream: Any = None) -> None:
        """The host mirrors to the static buffers on `stream` (the step stream when None; `width` table columns)."""
        cp, x, stream = self.cp, self.inputs, stream or self.stream
        x.meta.data.copy_from_host_async(x.host.ctypes.data, x.host.nbytes, stream)
        cp.cuda.runtime.memcpy2DAsync(x.tables.data.ptr, x.width * 4, x.host_tables.ctypes.data, x.width * 4,
                                      width * 4, x.n, cp.cuda.runtime.memcpyHostToDevice, stream.ptr)

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

    def replay_beside(self, h: HostBatch, rest: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
        """A mixed step's two parts at once: its decode rows `h` replay their graph on the graphs' stream, after
        what the step stream has queued (the step's block and state copies, the last read of the graph's outputs),
        while `rest()` queues the step's prompt runs eagerly on the step stream, which then waits for the replay.
        Returns the step's sampled rows' logits and greedy tokens, h's first (the step's row order), on the step
        stream."""
        cp = self.cp
        graph, logits, tokens = self.graphs[self.bucket(len(h.token_ids))]
        self._uploaded.synchronize()
        width = self.inputs.stage(h)
        self._queued.record(self.stream)
        self.side.wait_event(self._queued)
        self._upload(width, self.side)
        self._uploaded.record(self.side)
        graph.launch(self.side)
        self._replayed.record(self.side)
        try:
            rest_logits, rest_tokens = rest()
        finally:   # even when the eager part fails: nothing later on the step stream may overlap the replay
            self.stream.wait_event(self._replayed)
        with self.device, self.stream:
            n = len(h.sample_rows)   # (sample rows ascend: a prefix when none or the last is n - 1)
            rows = slice(0, n) if not n or h.sample_rows[-1] == n - 1 else cp.asarray(h.sample_rows)
            return cp.concatenate([logits[rows], rest_logits]), cp.concatenate([tokens[rows], rest_tokens])

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
