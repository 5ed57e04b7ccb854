"""The NCCL communicator on two GPUs (one process each, as the engine runs them): collectives give every rank the
same sums, in bf16 and float32 and under CUDA-graph capture; NVLink multicast is off in every rank; and aborting
rank 0's communicator after rank 1 died releases a collective that waits for it."""
from __future__ import annotations

import multiprocessing as mp
import os
import threading

import numpy as np
import pytest

from openinfer.testing.cuda import require_gpu

pytestmark = pytest.mark.cuda
cp = require_gpu()
if cp.cuda.runtime.getDeviceCount() < 2:
    pytest.skip("needs two GPUs", allow_module_level=True)

HANG_LIMIT_S = 120   # a collective still waiting after this long is hanging (it returns in milliseconds)


def _collectives(rank: int, nccl_id: tuple, out: mp.Queue) -> None:
    import cupy
    import ml_dtypes

    from openinfer.parallel.nccl import NcclCommunicator
    cupy.cuda.Device(rank).use()
    comm = NcclCommunicator(rank, 2, nccl_id)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = {"nvls": os.environ.get("NCCL_NVLS_ENABLE")}
    for name, dtype in (("f32", np.float32), ("bf16", bf16)):
        x = cupy.asarray((base * (rank + 1)).astype(dtype))
        got[name] = cupy.asnumpy(comm.all_reduce(x)).astype(np.float32)
    got["gather"] = cupy.asnumpy(comm.all_gather(cupy.asarray(base * (rank + 1))))
    got["bcast"] = cupy.asnumpy(comm.broadcast(cupy.asarray(base * (rank + 1)), root=1))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:   # an all_reduce captured in a graph, replayed twice
        x = cupy.asarray(base * (rank + 1))
        stream.begin_capture()
        comm.all_reduce(x)
        graph = stream.end_capture()
        graph.launch(stream)
        graph.launch(stream)
        stream.synchronize()
    got["graph"] = cupy.asnumpy(x)
    comm.barrier()
    out.put((rank, got))


def _join_then_die(rank: int, nccl_id: tuple) -> None:
    import cupy

    from openinfer.parallel.nccl import NcclCommunicator
    cupy.cuda.Device(rank).use()
    NcclCommunicator(rank, 2, nccl_id)
    os._exit(3)   # killed before the collective rank 0 is waiting in


def test_collectives_on_two_gpus():
    from openinfer.parallel.nccl import unique_id
    nccl_id, ctx = unique_id(), mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_collectives, args=(r, nccl_id, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=HANG_LIMIT_S) for _ in procs)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    for got in results.values():
        assert got["nvls"] == "0"
        np.testing.assert_array_equal(got["f32"], base * 3)
        np.testing.assert_array_equal(got["bf16"], base * 3)   # small integers: exact in bf16
        np.testing.assert_array_equal(got["gather"], np.stack([base, base * 2]))
        np.testing.assert_array_equal(got["bcast"], base * 2)
        np.testing.assert_array_equal(got["graph"], base * 6)   # replay 1: 1x + 2x on both ranks; replay 2: 3x + 3x


def test_abort_releases_a_collective_waiting_for_a_dead_rank():
    from openinfer.parallel.nccl import NcclCommunicator, unique_id
    nccl_id, ctx = unique_id(), mp.get_context("spawn")
    peer = ctx.Process(target=_join_then_die, args=(1, nccl_id))
    peer.start()
    cp.cuda.Device(0).use()
    comm = NcclCommunicator(0, 2, nccl_id)
    done = threading.Event()

    def waiting() -> None:
        cp.cuda.Device(0).use()
        try:
            comm.all_reduce(cp.ones(1 << 20, cp.float32))
            cp.cuda.get_current_stream().synchronize()
        except Exception:  # noqa: BLE001 — an error is a release too
            pass
        done.set()
    t = threading.Thread(target=waiting, daemon=True)
    t.start()
    peer.join()
    assert peer.exitcode == 3
    comm.abort()   # what the executor's watchdog does when a rank dies
    assert done.wait(HANG_LIMIT_S), "the collective still waits for the dead rank after ncclCommAbort"
