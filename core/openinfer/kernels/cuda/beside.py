"""`beside`: ops that run on a second stream beside the ones launched after them, joined where their result is read.

A decode step at small batch is a chain of kernels that each leave most of the GPU idle: DeepSeekMoE's shared
experts (two GEMVs) need nothing from the router or the routed experts, and MLA's W_UK nothing from the latents'
write, so run beside them they share the GPU instead of queuing behind them. `beside(fn, *args)` forks a side
stream of the current one (an event recorded here, waited for there), runs `fn` there and returns a `Beside`
holding its result; `ready(x)` (the op `joined`, or a kernel wrapper taking the Beside as it is) makes the current
stream wait for that result before handing it over (any other value passes through). Under CUDA-graph capture the
fork and the join are the graph's edges, so replays run the two branches side by side too.

The side stream's kernels run in a lane of their own (lanes.side_of): the cuBLAS workspace and the arrival
counters of split kernels are written by each call, so two calls at once must not share them. Its allocations come
from CuPy's pool as the stream's own; the inputs stay referenced (by the caller) until the join, after which the main
stream's later work is ordered behind the side's reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import cupy as cp

from . import lanes

_streams: dict[tuple[int, int], cp.cuda.Stream] = {}   # (device, main stream) -> its side stream, kept for good


@dataclass
class Beside:
    """The result of ops launched on a side stream; `done` is recorded there after them."""
    value: Any
    done: cp.cuda.Event
    joined: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    @property
    def dtype(self) -> Any:
        return self.value.dtype

    def __getitem__(self, index: Any) -> Beside:
        """A view of the value, joined on its own when read."""
        return Beside(self.value[index], self.done)

    def result(self) -> Any:
        """The value, once the current stream waits for the side stream's ops (the first call makes it wait)."""
        if not self.joined:
            cp.cuda.get_current_stream().wait_event(self.done)
            self.joined = True
        return self.value


def side_stream(main: cp.cuda.Stream) -> cp.cuda.Stream:
    key = (cp.cuda.Device().id, main.ptr)
    side = _streams.get(key)
    if side is None:
        side = _streams[key] = cp.cuda.Stream(non_blocking=True)
    return side


def beside(fn: Callable[..., Any], *args: Any) -> Beside:
    """fn(*args) launched on the current stream's side stream, after everything already queued on this one."""
    main = cp.cuda.get_current_stream()
    side = side_stream(main)
    fork = cp.cuda.Event(disable_timing=True)
    fork.record(main)
    side.wait_event(fork)
    with side, lanes.lane(lanes.side_of(lanes.current())):
        value = fn(*args)
        done = cp.cuda.Event(disable_timing=True)
        done.record(side)
    return Beside(value, done)


def ready(x: Any) -> Any:
    """x's value, joined on the current stream if it is a Beside."""
    return x.result() if isinstance(x, Beside) else x
