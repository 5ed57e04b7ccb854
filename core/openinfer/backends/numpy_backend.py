"""The CPU backend: numpy arrays, float32 compute. Also the interface every backend implements."""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..sampling.sampler import score_rows
from .block_copy import BlockCopier, HostPoolCopier

if TYPE_CHECKING:
    from ..parallel.communicator import Communicator
    from ..loading.weights import WeightSource


class Backend(ABC):
    name: str          # kernel-registry backend name: "numpy" or "cuda"
    dtype: str         # compute/storage dtype of activations, weights and KV
    xp: Any            # the array module (numpy or cupy)
    samples_on_device = False   # True: sample(logits, batch) draws every row on the device
    # the expert-parallel group this device is a rank of (parallel/); None: the model runs on this device alone
    comm: Communicator | None = None
    compute_capability: int | None = None   # the GPU's (90 for sm_90); kernel implementations may require one

    @abstractmethod
    def asarray(self, host: np.ndarray, dtype: str | None = None) -> Any:
        """Copy a host array to the device (weights: in the model dtype unless `dtype` says)."""

    @abstractmethod
    def to_host(self, x: Any) -> np.ndarray: ...

    def load(self, weights: WeightSource, *names: str) -> Any:
        """Checkpoint tensors on the device in the model dtype; several names are concatenated
        along their first axis (fused projections, one GEMM). Backends override this to stream
        the checkpoint's raw bytes instead of converting on the host."""
        parts = [weights.get(n) for n in names]
        return self.asarray(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0))

    def loaded(self) -> None:
        """Weights are all in: release whatever loading needed (staging buffers)."""

    @abstractmethod
    def zeros(self, shape: tuple[int, ...], dtype: str | None = None) -> Any: ...

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on the CPU)."""

    def current(self) -> AbstractContextManager[Any]:
        """A block in which the calling thread queues this backend's device work (no-op on the CPU): on a GPU
        kernels launch on the thread's current stream, which must be the backend's own."""
        return nullcontext()

    @abstractmethod
    def argmax(self, logits: Any) -> Any:
        """The greedy token of each row of [S, vocab] logits (ties: the lowest index)."""

    def score_rows(self, logits: Any, targets: np.ndarray, k: int) -> tuple[Any, Any, Any, Any]:
        """Prompt logprobs: each row's target token scored (sampling.score_rows), as arrays `to_host` takes."""
        return score_rows(self.to_host(logits), targets, k)

    def decode_graphs(self, forward: Any, max_num_seqs: int, max_model_len: int, block_size: int,
                      state_slots: bool = False, pdl_rows: int | None = None) -> Any:
        """Captured decode steps (see backends/cuda_graphs.py), or None where a backend has none.
        `state_slots`: the model's batches carry state rows (bounded per-request state); `pdl_rows`: graphs of up
        to this many rows capture with programmatic dependent launch, None: every one (Model.pdl_decode_rows)."""
        return None

    def pool_bytes(self) -> int:
        """Bytes the device allocator holds (in use or cached for reuse); 0 where nothing is tracked."""
        return 0

    def release_cached(self) -> None:
        """Hand the allocator's cached free blocks back to the device."""

    def kv_budget_bytes(self, requested: int | None, reserve: int = 0) -> int:
        """Bytes the KV pools may take; the CPU backend has no natural limit so it needs one."""
        return requested if requested is not None else 1 << 30

    def block_copier(self, device_arrays: Sequence[Any], num_host_blocks: int) -> BlockCopier:
        """A host pool of `num_host_blocks` blocks for these [num_blocks, ...] device arrays, and
        the copies between them (the host offload tier's primitives)."""
        return HostPoolCopier(device_arrays, num_host_blocks)


class NumpyBackend(Backend):
    name = "numpy"
    dtype = "float32"
    xp = np

    def asarray(self, host: np.ndarray, dtype: str | None = None) -> np.ndarray:
        target = np.dtype(dtype or self.dtype) if host.dtype.kind == "f" or dtype else host.dtype
        return np.ascontiguousarray(host, dtype=target)

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x

    def zeros(self, shape: tuple[int, ...], dtype: str | None = None) -> np.ndarray:
        return np.zeros(shape, dtype=dtype or self.dtype)

    def argmax(self, logits: np.ndarray) -> np.ndarray:
        return np.argmax(logits, axis=-1)
