"""The CPU backend: numpy arrays, float32 compute. Also the interface every backend implements."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import numpy as np

from .block_copy import BlockCopier, HostPoolCopier


class Backend(ABC):
    name: str          # kernel-registry backend name: "numpy" or "cuda"
    dtype: str         # compute/storage dtype of activations, weights and KV
    xp: Any            # the array module (numpy or cupy)

    @abstractmethod
    def asarray(self, host: np.ndarray, dtype: str | None = None) -> Any:
        """Copy a host array to the device (weights: in the model dtype unless `dtype` says)."""

    @abstractmethod
    def to_host(self, x: Any) -> np.ndarray: ...

    @abstractmethod
    def zeros(self, shape: tuple[int, ...], dtype: str | None = None) -> Any: ...

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on the CPU)."""

    def kv_budget_bytes(self, requested: int | None) -> int:
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
