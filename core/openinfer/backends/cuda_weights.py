"""Checkpoint tensors onto the GPU without passing the checkpoint through Python objects.

Raw safetensors bytes go mmap -> a pinned staging buffer -> the device slice they belong to; a
few buffers in turn, filled by a small thread pool (one thread copies page-cache pages at ~6 GB/s,
the upload runs at ~50), so host copies overlap each other and the uploads; a dtype change
(an F32 or F16 checkpoint served in bf16) happens on the device. Dummy weights are drawn on the
GPU itself. Nothing of the checkpoint stays in host memory afterwards.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np

from ..weights import DummyWeights, WeightSource, stable_hash

CHUNK_BYTES = 32 << 20
BUFFERS = 4
_STORAGE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


class WeightUploader:
    def __init__(self, cp: Any, stream: Any, dtypes: dict[str, np.dtype]) -> None:
        self.cp, self.stream, self.dtypes = cp, stream, dtypes
        self._buffers = [cp.cuda.alloc_pinned_memory(CHUNK_BYTES) for _ in range(BUFFERS)]
        self._done = [cp.cuda.Event() for _ in range(BUFFERS)]
        for e in self._done:
            e.record(stream)
        self._turn = 0
        self._copiers = ThreadPoolExecutor(BUFFERS, thread_name_prefix="weights")

    def load(self, weights: WeightSource, names: Sequence[str], dtype: np.dtype) -> Any:
        """The tensors concatenated along axis 0, as one device array of `dtype`."""
        cp = self.cp
        shapes = [self._shape(weights, n) for n in names]
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
        return out if len(shapes[0]) else out.reshape(())

    @staticmethod
    def _shape(weights: WeightSource, name: str) -> tuple[int, ...]:
        if isinstance(weights, DummyWeights):
            return tuple(weights.shapes[name])
        return tuple(weights.raw(name)[1])

    def _dummy(self, weights: DummyWeights, name: str, view: Any) -> None:
        """Same distribution as DummyWeights.get, drawn on the device (values differ from the CPU's)."""
        cp = self.cp
        rng = cp.random.RandomState((weights.seed * 1_000_003 + stable_hash(name)) % (1 << 32))
        x = rng.standard_normal(view.shape, dtype=cp.float32)
        view[...] = (1.0 + 0.1 * x) if view.ndim == 1 else weights.std * x

    def _copy(self, weights: WeightSource, name: str, view: Any) -> None:
        cp = self.cp
        kind, _, raw = weights.raw(name)
        storage = self.dtypes.get(_STORAGE.get(kind, ""), raw.dtype)
        target = view if storage == view.dtype else cp.empty(view.shape, dtype=storage)
        src = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
        dst = target.reshape(-1).view(cp.uint8)
        pending: deque[tuple[Future, int, int, np.ndarray]] = deque()
        for start in range(0, src.nbytes, CHUNK_BYTES):
            n = min(CHUNK_BYTES, src.nbytes - start)
            i, self._turn = self._turn, (self._turn + 1) % BUFFERS
            self._done[i].synchronize()  # the upload that last used this buffer has finished
            staged = np.frombuffer(self._buffers[i], dtype=np.uint8, count=n)
            pending.append((self._copiers.submit(np.copyto, staged, src[start: start + n]), i, start, staged))
            if len(pending) == BUFFERS:
                self._upload(pending.popleft(), dst)
        while pending:
            self._upload(pending.popleft(), dst)
        if target is not view:
            view[...] = target.astype(view.dtype)

    def _upload(self, item: tuple[Future, int, int, np.ndarray], dst: Any) -> None:
        copied, i, start, staged = item
        copied.result()
        dst[start: start + staged.nbytes].set(staged, self.stream)
        self._done[i].record(self.stream)

    def close(self) -> None:
        self._copiers.shutdown()
