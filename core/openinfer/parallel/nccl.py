"""The GPU group: NCCL through CuPy's binding (cupy.cuda.nccl), one GPU a process.

CuPy is the CUDA backend's array library already, and on the GPU hosts NCCL comes as the
nvidia-nccl-cu13 wheel CuPy loads; its NcclCommunicator has the collectives used here (allReduce,
allGather, bcast) and ncclCommAbort. Collectives run on the calling thread's current CuPy stream
(the backend's step stream), so they order with the forward's kernels and are captured into its
CUDA graphs like any kernel. NVLink multicast (NVLS) stays off wherever NCCL is initialised: on
shared hosts a program using it can take the GPUs out of service.
"""
from __future__ import annotations

import os
from typing import Any

INSTALL_HINT = 'pip install "nvidia-nccl-cu13>=2.27.7,<3" (CUDA 12: nvidia-nccl-cu12)'


def nvls_off() -> None:
    """Keep NVLink multicast off: set before any communicator is created, and inherited by the
    worker processes started after it."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"


def _nccl() -> Any:
    nvls_off()
    try:
        from cupy.cuda import nccl
    except ImportError as e:
        raise RuntimeError(f"expert parallelism on GPUs needs CuPy with NCCL ({e}); {INSTALL_HINT}") from e
    if not nccl.available:
        raise RuntimeError(f"CuPy cannot load the NCCL library; {INSTALL_HINT}")
    return nccl


def unique_id() -> tuple[int, ...]:
    """The group's NCCL id, made by rank 0 and handed to the other ranks when they start."""
    return _nccl().get_unique_id()


class NcclCommunicator:
    """Rank `rank` of `world_size`, on the current CuPy device (create it after the backend)."""

    def __init__(self, rank: int, world_size: int, nccl_id: tuple[int, ...]) -> None:
        import cupy
        self._cp, self._nccl = cupy, _nccl()
        self.rank, self.world_size = rank, world_size
        self._comm = self._nccl.NcclCommunicator(world_size, nccl_id, rank)

    def _type(self, x: Any) -> int:
        n = self._nccl
        types = {"float32": n.NCCL_FLOAT32, "bfloat16": n.NCCL_BFLOAT16, "float16": n.NCCL_FLOAT16,
                 "int32": n.NCCL_INT32, "int64": n.NCCL_INT64}
        if x.dtype.name not in types:
            raise TypeError(f"NCCL collectives here take {', '.join(types)}; got {x.dtype.name}")
        if not x.flags.c_contiguous:
            raise ValueError("NCCL collectives need C-contiguous arrays")
        return types[x.dtype.name]

    def _stream(self) -> int:
        return self._cp.cuda.get_current_stream().ptr

    def all_reduce(self, x: Any) -> Any:
        self._comm.allReduce(x.data.ptr, x.data.ptr, x.size, self._type(x), self._nccl.NCCL_SUM, self._stream())
        return x

    def all_gather(self, x: Any) -> Any:
        out = self._cp.empty((self.world_size, *x.shape), x.dtype)
        self._comm.allGather(x.data.ptr, out.data.ptr, x.size, self._type(x), self._stream())
        return out

    def broadcast(self, x: Any, root: int = 0) -> Any:
        self._comm.bcast(x.data.ptr, x.size, self._type(x), root, self._stream())
        return x

    def barrier(self) -> None:
        self.all_reduce(self._cp.zeros(1, self._cp.float32))
        self._cp.cuda.get_current_stream().synchronize()

    def abort(self) -> None:
        """ncclCommAbort: NCCL kernels waiting for a dead rank return, so the host stops waiting."""
        self._comm.abort()
