"""Checkpoint tensors onto the GPU without passing the checkpoint through Python objects.

Raw safetensors bytes go file -> a pinned staging buffer -> the device slice they belong to. A
pool of reading threads (staged_read.py) does both steps: each reads a piece with pread and starts
its H2D copy on a stream of its own, so reads overlap each other and the uploads. Ordering with the
step stream runs both ways through events: a tensor's copies wait for the step-stream work queued
before its buffer was allocated (the pool may hand out memory a queued kernel still reads), and the
step stream waits for the copies before load() returns, so callers may use the array at once (the
Qwen3.5 line adds 1 to its norms at load). A dtype change (an F32 or F16 checkpoint served in bf16)
happens on the device. Dummy weights are drawn on the GPU itself by one kernel per tensor
(random_fill.cu), so they need neither the staging buffers nor the threads, which are made at the
first checkpoint read. Nothing of the checkpoint stays in host memory afterwards: finish() frees
the threads, close() lets the buffers go.
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from ..sampling.philox import split64
from ..loading.weights import Checkpoint, DummyWeights, WeightSource, stable_hash
from .staged_read import StagedReader, copy_threads

CHUNK_BYTES = 8 << 20   # per staging buffer; two per reading thread (128 MiB of pinned memory at 8 threads)
_STORAGE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


class WeightUploader:
    def __init__(self, cp: Any, device: Any, stream: Any, dtypes: dict[str, np.dtype]) -> None:
        self.cp, self.device, self.stream, self.dtypes = cp, device, stream, dtypes
        self._local = threading.local()
        self._buffers: list[np.ndarray] = []
        self._reader: StagedReader | None = None   # see _staged_reader (dummy weights need none)

    def load(self, weights: WeightSource, names: Sequence[str], dtype: np.dtype) -> Any:
        """The tensors concatenated along axis 0, as one device array of `dtype`, ready for the step stream."""
        cp = self.cp
        scalar = self._shape(weights, names[0]) == ()
        shapes = [self._shape(weights, n) or (1,) for n in names]   # a 0-d tensor travels as one element
        rest = shapes[0][1:]
        if any(s[1:] != rest for s in shapes):
            raise ValueError(f"cannot fuse tensors of shapes {shapes} ({', '.join(names)})")
        with self.stream:
            out = cp.empty((sum(s[0] for s in shapes), *rest), dtype=dtype)
            at = 0
            for name, shape in zip(names, shapes):
                view = out[at: at + shape[0]]
                at += shape[0]
                if isinstance(weights, DummyWeights):
                    self._dummy(weights, name, view)
                else:
                    self._copy(weights, name, view)
        return out.reshape(()) if scalar else out

    @staticmethod
    def _shape(weights: WeightSource, name: str) -> tuple[int, ...]:
        if isinstance(weights, DummyWeights):
            return tuple(weights.shapes[name])
        return tuple(weights.raw(name)[1])

    @staticmethod
    def _dummy(weights: DummyWeights, name: str, view: Any) -> None:
        """Same distribution as DummyWeights.get, drawn on the device (values differ from the CPU's).
        One kernel, not cupy.random: a cuRAND generator per tensor (~400 for Qwen3-4B) is set up and
        seeded each time, cuRAND's library loaded, and a float32 temporary made and scaled per tensor."""
        from ..kernels.cuda.random_fill import fill_normal
        key = split64(weights.seed * 1_000_003 + stable_hash(name))
        fill_normal(view, key, *((1.0, 0.1) if view.ndim == 1 else (0.0, weights.std)))

    def _copy(self, weights: Checkpoint, name: str, view: Any) -> None:
        cp = self.cp
        kind, _, raw = weights.raw(name)
        storage = self.dtypes.get(_STORAGE.get(kind, ""), raw.dtype)
        target = view if storage == view.dtype else cp.empty(view.shape, dtype=storage)
        dst = target.reshape(-1).view(cp.uint8)
        allocated = cp.cuda.Event(disable_timing=True)
        allocated.record(self.stream)
        path, offset, nbytes = weights.span(name)
        for done in self._staged_reader().read(path, offset, nbytes, dst, allocated):
            self.stream.wait_event(done.result())
        if target is not view:
            view[...] = target.astype(view.dtype)

    def _staged_reader(self) -> StagedReader:
        """The reading threads and their pinned buffers, made at the first checkpoint read."""
        if self._reader is None:
            threads = copy_threads()
            self._buffers = [np.frombuffer(self.cp.cuda.alloc_pinned_memory(CHUNK_BYTES), dtype=np.uint8,
                                           count=CHUNK_BYTES) for _ in range(2 * threads)]
            self._reader = StagedReader(self._buffers, self._upload, threads, self._thread_setup)
        return self._reader

    def _thread_setup(self) -> None:
        self.device.use()
        self._local.stream = self.cp.cuda.Stream(non_blocking=True)

    def _upload(self, staged: np.ndarray, dst: Any, at: int, allocated: Any) -> Any:
        """On a reading thread: H2D of one filled buffer, after the step-stream work queued before
        `dst` was allocated; returns the event that marks the copy done."""
        cp, stream = self.cp, self._local.stream
        stream.wait_event(allocated)
        cp.cuda.runtime.memcpyAsync(dst.data.ptr + at, staged.ctypes.data, staged.nbytes,
                                    cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
        done = cp.cuda.Event(disable_timing=True)
        done.record(stream)
        return done

    def close(self) -> None:
        """Wait for every copy, stop the threads and drop the pinned buffers (the reader refers back
        to us through its sink: dropping it here frees them now rather than at a later GC)."""
        if self._reader is not None:
            self._reader.finish()
        self._reader, self._buffers = None, []
