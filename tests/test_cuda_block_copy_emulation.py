"""The CUDA block copier's ordering on the CPU: a stand-in for the few CuPy calls it makes (streams,
events, cudaMemcpyAsync on raw pointers) runs each stream's queue in an adversarial order that
respects only stream order and wait_event, with real byte copies. A missing wait shows as wrong
data; a needless one as a copy that cannot land while another stream is frozen."""
from __future__ import annotations

import ctypes
import itertools
from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np

from openinfer.backends.cuda_block_copy import CudaBlockCopier


class Sim:
    """Streams run their queues when asked, favouring the streams listed first; frozen ones never."""

    def __init__(self) -> None:
        self.streams: dict[int, FakeStream] = {}
        self.order: list[FakeStream] = []
        self.frozen: set[int] = set()

    def step(self) -> bool:
        for s in self.order:
            if s.ptr not in self.frozen and s.runnable():
                s.run_one()
                return True
        return False

    def run(self) -> None:
        while self.step():
            pass


class FakeStream:
    _ids = itertools.count(1)

    def __init__(self, sim: Sim, non_blocking: bool = False) -> None:
        self.sim, self.ptr, self.ops, self.executed = sim, next(self._ids), [], 0
        sim.streams[self.ptr] = self
        sim.order.append(self)

    def wait_event(self, event: "FakeEvent") -> None:
        self.ops.append(("wait", event))

    def enqueue(self, fn) -> None:
        self.ops.append(("run", fn))

    def runnable(self) -> bool:
        if self.executed == len(self.ops):
            return False
        kind, arg = self.ops[self.executed]
        return kind != "wait" or arg.done

    def run_one(self) -> None:
        kind, arg = self.ops[self.executed]
        if kind == "run":
            arg()
        self.executed += 1


class FakeEvent:
    def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
        self.stream: FakeStream | None = None
        self.index = 0

    def record(self, stream: FakeStream) -> None:
        self.stream, self.index = stream, len(stream.ops)

    @property
    def done(self) -> bool:
        return self.stream is None or self.stream.executed >= self.index

    def synchronize(self) -> None:
        self.stream.sim.run()
        assert self.done, "waited for an event that cannot complete"


def fake_cupy(sim: Sim) -> SimpleNamespace:
    def memcpy_async(dst: int, src: int, n: int, kind: int, stream: int) -> None:
        sim.streams[stream].enqueue(lambda: ctypes.memmove(dst, src, n))

    runtime = SimpleNamespace(memcpyAsync=memcpy_async, memcpyDeviceToHost=2, memcpyHostToDevice=1)
    cuda = SimpleNamespace(Stream=lambda non_blocking=False: FakeStream(sim, non_blocking), Event=FakeEvent,
                           runtime=runtime, alloc_pinned_memory=lambda n: bytearray(n),
                           get_elapsed_time=lambda start, end: 1.0)
    return SimpleNamespace(cuda=cuda)


def device_array(a: np.ndarray) -> SimpleNamespace:
    """What the copier reads of a CuPy array: layout and the raw pointer."""
    return SimpleNamespace(flags=a.flags, shape=a.shape, dtype=a.dtype, strides=a.strides,
                           data=SimpleNamespace(ptr=a.ctypes.data))


def setup(order: tuple[str, ...], n: int = 8, slots: int = 16):
    sim = Sim()
    step = FakeStream(sim)
    backend = SimpleNamespace(xp=fake_cupy(sim), device=nullcontext(), stream=step)
    k = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
    v = -k
    copier = CudaBlockCopier(backend, [device_array(k), device_array(v)], slots)
    streams = {"step": step, "d2h": copier._d2h, "h2d": copier._h2d}
    sim.order = [streams[s] for s in order]
    return sim, streams, copier, k, v


def test_reuse_orders_the_new_owners_writes_after_the_save_and_a_save_alone_orders_nothing():
    sim, streams, copier, k, v = setup(("step", "h2d", "d2h"))   # the step stream runs first where it may
    want = k.copy()
    saved = copier.save([(1, 0), (2, 1)])
    assert streams["step"].ops == []                            # saving ahead of eviction costs the step nothing
    copier.reuse([1, 2, 5])                                     # block 5 was never saved: nothing to wait for
    streams["step"].enqueue(lambda: k.fill(0))                  # the new owner writes
    saved.wait()
    sim.run()
    np.testing.assert_array_equal(copier.host[0][[0, 1]], want[[1, 2]])
    assert not k.any()


def test_a_restore_waits_for_the_saves_of_its_own_blocks_and_slots_only():
    sim, streams, copier, k, v = setup(("h2d", "step", "d2h"))   # restores first, saves last where they may
    want_k, want_v = k.copy(), v.copy()
    copier.save([(b, b) for b in range(4)])                     # slots 0-3 being filled
    copier.save([(b, 4 + b) for b in range(4, 8)])              # blocks 4-7 being read into slots 8-11
    restored = copier.restore([(4, 0), (5, 1)])                 # from slots 0, 1 into blocks 4, 5
    restored.wait()
    sim.run()
    np.testing.assert_array_equal(copier.host[0][8:12], want_k[4:8])   # blocks 4, 5 left before being overwritten
    np.testing.assert_array_equal(copier.host[1][:4], want_v[:4])
    np.testing.assert_array_equal(k[[4, 5]], want_k[[0, 1]])
    assert restored.copy_ms() == 1.0


def test_a_restore_lands_while_unrelated_saves_are_still_in_flight():
    sim, streams, copier, k, v = setup(("step", "h2d", "d2h"))
    want_k = k.copy()
    copier.save([(b, b) for b in range(2)]).wait()               # slots 0, 1 hold blocks 0, 1
    ahead = copier.save([(b, 8 + b) for b in range(2, 8)])       # a background save of other blocks
    sim.frozen.add(streams["d2h"].ptr)                          # ... that never progresses here
    restored = copier.restore([(0, 1), (1, 0)])
    sim.run()
    assert restored.done() and not ahead.done()
    np.testing.assert_array_equal(k[[0, 1]], want_k[[1, 0]])
