"""GPU test modules: skip the whole module where no usable NVIDIA GPU is present."""
from __future__ import annotations

from typing import Any, Iterator


def require_gpu() -> Any:
    """The cupy module, or skip the calling test module (no cupy, no driver, or no device)."""
    import pytest
    cp = pytest.importorskip("cupy", reason="cupy is not installed")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
    except Exception as e:  # no driver, or one too old for this cupy build
        pytest.skip(f"no usable NVIDIA GPU: {e}", allow_module_level=True)
    return cp


def kernel_stream() -> Iterator[Any]:
    """Run the test on a stream of its own, as the engine runs: kernels launch with programmatic
    dependent launch only off the legacy default stream (kernels/cuda/pdl.py), so this is what tests
    them under it. Kernel test modules use it as an autouse fixture:
    `own_stream = pytest.fixture(autouse=True)(kernel_stream)`."""
    import cupy as cp
    with cp.cuda.Stream(non_blocking=True) as stream:
        yield stream
