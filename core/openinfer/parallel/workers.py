"""The worker processes of an expert-parallel engine: ranks 1..N-1, one process per device.

Each worker loads the same checkpoint with the same flags as rank 0 (its own shard of the experts),
so every rank runs the same load-time forwards (activation profile, graph capture) and agrees on the
KV pool size; then it runs each step rank 0 sends it (model_runner.Step) until told to stop or until
rank 0's pipe closes. Processes start with spawn (CUDA contexts do not survive fork). A watchdog
thread in the engine's process waits on the workers' exits: one that dies while the engine runs
marks the group failed (the engine then fails its requests and dies, so /health says 503 and the
server exits non-zero) and aborts rank 0's communicator, so a collective waiting for the dead rank
returns instead of hanging; the other workers are stopped.
"""
from __future__ import annotations

import importlib
import logging
import multiprocessing as mp
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Callable

from .communicator import Communicator, RankFailed
from .pipes import PipeCommunicator

if TYPE_CHECKING:
    from ..engine.engine_args import EngineArgs
    from ..engine.model_runner import Step
    from ..contract.plugins import Plugins

log = logging.getLogger("openinfer.parallel")
STOP_TIMEOUT_S = 10.0   # a worker told to stop that is still running after this is terminated
DEATH_NOTICE_S = 2.0    # how long a rank 0 that found a peer's pipe closed waits for the watchdog's word


@dataclass
class WorkerSpec:
    """What a worker needs to load its rank: the engine's model and flags, the plugins registered
    in-process in the engine's process ((name, module) pairs: entry points load by themselves), and
    the NCCL id on GPUs (None: the CPU group over pipes)."""
    model: str | None
    args: EngineArgs
    plugins: list[tuple[str, str]]
    nccl_id: tuple[int, ...] | None


def in_process_plugins(plugins: Plugins) -> list[tuple[str, str]]:
    return [(info.name, plugins.pm.get_plugin(info.name).__name__) for info in plugins.infos
            if info.distribution == "(in-process)"]


class Workers:
    """Ranks 1..world_size-1, started at construction; rank 0 joins through `connect`."""

    def __init__(self, model: str | None, args: EngineArgs, plugins: Plugins) -> None:
        self.world_size = args.ep
        nccl_id = None
        if args.device != "cpu":
            from .nccl import unique_id
            nccl_id = unique_id()   # (also turns NVLink multicast off in the environment the workers inherit)
        self._nccl_id = nccl_id
        spec = WorkerSpec(model, args, in_process_plugins(plugins), nccl_id)
        ctx = mp.get_context("spawn")
        self.ctrl: list[Connection] = []
        self._comm_pipes: list[Connection] = []
        self.procs: list[Any] = []
        for rank in range(1, self.world_size):
            ctrl, ctrl_child = ctx.Pipe()
            comm, comm_child = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(rank, self.world_size, spec, ctrl_child, comm_child),
                            name=f"openinfer-ep-rank{rank}", daemon=True)
            p.start()
            ctrl_child.close()   # only the worker holds its ends: its death closes the pipes
            comm_child.close()
            self.ctrl.append(ctrl)
            self._comm_pipes.append(comm)
            self.procs.append(p)
        self.comm: Communicator | None = None
        self.dead_reason: str | None = None
        self._stopping = False
        self._wake_r, self._wake_w = ctx.Pipe(duplex=False)
        self._watchdog = threading.Thread(target=self._watch, name="openinfer-ep-watchdog", daemon=True)
        self._watchdog.start()

    def connect(self, backend: Any) -> Communicator:
        """Rank 0's communicator (after its backend: NCCL binds to the current device)."""
        if self._nccl_id is not None:
            from .nccl import NcclCommunicator
            self.comm = NcclCommunicator(0, self.world_size, self._nccl_id)
        else:
            self.comm = PipeCommunicator(0, self.world_size, self._comm_pipes)
        return self.comm

    def wait_ready(self) -> None:
        """Wait for every worker's load (after rank 0's own); a worker's load error is raised here."""
        for rank, c in enumerate(self.ctrl, 1):
            try:
                kind, detail = c.recv()
            except (EOFError, OSError):
                raise RankFailed(f"expert-parallel rank {rank} exited while loading") from None
            if kind != "ready":
                raise RuntimeError(f"expert-parallel rank {rank} failed to load: {detail}")

    def load_error(self) -> str | None:
        """A worker's load error, if one reported it (rank 0's load then fails waiting for that rank)."""
        for rank, c in enumerate(self.ctrl, 1):
            try:
                if c.poll(1.0):
                    kind, detail = c.recv()
                    if kind == "error":
                        return f"expert-parallel rank {rank} failed to load: {detail}"
            except (EOFError, OSError):
                continue
        return None

    def send(self, step: Step) -> None:
        self.check()
        for rank, c in enumerate(self.ctrl, 1):
            try:
                c.send(step)
            except OSError as e:
                self.check(DEATH_NOTICE_S)   # a closed pipe is a rank that died: the watchdog's word names how
                raise RankFailed(f"expert-parallel rank {rank} is gone ({type(e).__name__})") from None

    def check(self, wait_s: float = 0.0) -> None:
        """Raise RankFailed if a worker died. `wait_s`: a collective just found a rank gone, so give the
        watchdog that long to name which one and how it ended."""
        if wait_s and self.dead_reason is None:
            self._watchdog.join(wait_s)
        if self.dead_reason is not None:
            raise RankFailed(self.dead_reason)

    def shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._wake_w.send(None)
        for c in self.ctrl:
            try:
                c.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_TIMEOUT_S   # one wait for all: a rank stuck in a collective
        for p in self.procs:                            # does not hold the others' stop up
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join()

    def _watch(self) -> None:
        sentinels = {p.sentinel: (rank, p) for rank, p in enumerate(self.procs, 1)}
        ready = wait([*sentinels, self._wake_r])
        if self._stopping or self._wake_r in ready:
            return
        rank, p = next(sentinels[s] for s in ready if s in sentinels)
        p.join()
        self.dead_reason = f"expert-parallel rank {rank} (pid {p.pid}) died with exit status {p.exitcode}"
        log.error("%s: stopping the other ranks; the engine cannot compute without it", self.dead_reason)
        if self.comm is not None:
            self.comm.abort()
        for other in self.procs:
            if other is not p and other.is_alive():
                other.terminate()


def worker_main(rank: int, world_size: int, spec: WorkerSpec, ctrl: Connection, comm_pipe: Connection) -> None:
    """A worker process: load rank `rank`, then run the steps rank 0 sends until None or its exit."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s %(name)s [rank {rank}]: %(message)s")
    from ..loading.loader import load_rank, read_source
    from ..contract.plugins import Plugins

    def connect(backend: Any) -> Communicator:
        if spec.nccl_id is not None:
            from .nccl import NcclCommunicator
            return NcclCommunicator(rank, world_size, spec.nccl_id)
        return PipeCommunicator(rank, world_size, [comm_pipe])

    try:
        plugins = Plugins().load()
        for name, module in spec.plugins:
            plugins.register(name, importlib.import_module(module))
        runner = load_rank(read_source(spec.model, spec.args, plugins), spec.args, rank, connect).runner
    except Exception as e:  # noqa: BLE001 — reported to rank 0, which fails the load with it
        log.error("loading failed:\n%s", traceback.format_exc())
        try:
            ctrl.send(("error", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
        sys.exit(1)
    ctrl.send(("ready", None))
    serve_steps(runner.execute, ctrl)


def serve_steps(execute: Callable[..., Any], ctrl: Connection) -> None:
    """Run each step received on `ctrl` until None (shutdown) or end-of-file (rank 0 is gone). An error
    in a step ends the process: the ranks' collectives no longer pair up, so the group cannot go on."""
    prev = None
    while True:
        try:
            step = ctrl.recv()
        except (EOFError, OSError):
            return
        if step is None:
            return
        prev = execute(step, prev=prev)
