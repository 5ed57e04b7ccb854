"""GPU test modules: skip the whole module where no usable NVIDIA GPU is present."""
from __future__ import annotations

from typing import Any


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
