"""Running recorded launches on the CPU (the MLA and MoE emulation tests): the launchers run on host stand-ins for
cupy arrays (openinfer.testing.launch_check), and each recorded launch is handed, with its own arguments, to a numpy
emulation of its kernel that reads and writes those arrays' memory through the pointers the kernel would get. So a
wrapper's argument order, strides and grid are checked together with the kernel's index math."""
from __future__ import annotations

from typing import Callable

import numpy as np

from openinfer.testing.launch_check import Launch


def flat(a: np.ndarray) -> np.ndarray:
    """A writable 1-D view of memory from a's first element to the end of its allocation, as the kernel's pointer
    sees it (element i at a's address + i * itemsize)."""
    root = a
    while root.base is not None:
        root = root.base
    n = (root.ctypes.data + root.nbytes - a.ctypes.data) // a.itemsize
    return np.lib.stride_tricks.as_strided(a.view(np.ndarray), (n,), (a.itemsize,))


def run(launches: list[Launch], kernels: dict[str, Callable[[Launch], None]]) -> None:
    """Each recorded launch, in order, through the emulation of its kernel (by name, longest prefix)."""
    for call in launches:
        name = max((k for k in kernels if call.name.startswith(k)), key=len)
        kernels[name](call)
