"""Device backends. `get_backend("cpu" | "cuda[:N]")` returns one; the CUDA one is imported lazily."""
from __future__ import annotations

from .numpy_backend import Backend, NumpyBackend


def get_backend(device: str, dtype: str | None = None, gpu_memory_utilization: float = 0.90) -> Backend:
    if device == "cpu":
        if dtype not in (None, "float32"):
            raise ValueError(f"the CPU backend computes in float32; --dtype {dtype} is not supported there")
        return NumpyBackend()
    if device == "cuda" or device.startswith("cuda:"):
        from .cuda_backend import CudaBackend
        index = int(device.partition(":")[2] or 0)
        return CudaBackend(index, dtype or "bfloat16", gpu_memory_utilization)
    raise ValueError(f"unknown device {device!r}: use cpu, cuda or cuda:N")
