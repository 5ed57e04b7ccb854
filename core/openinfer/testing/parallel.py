"""Expert-parallel checks for model lines: record the steps an EP = 1 engine runs, replay them on N ranks
(threads of this process joined by an in-process group) and compare the logits."""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from ..engine.engine import Engine
from ..engine.engine_args import EngineArgs
from ..loading.loader import load_rank, read_source
from ..engine.model_runner import Step
from ..parallel import LocalGroup
from ..contract.plugins import Plugins
from .graphs import EmulatedGraphs


def run_ranks(comms: Sequence[Any], body: Callable[[Any], Any]) -> list[Any]:
    """body(comm) on a thread per rank; the results in rank order. A rank that raises aborts its group
    (the others raise RankFailed instead of waiting for it) and its exception is re-raised here."""
    out: list[Any] = [None] * len(comms)
    errors: list[BaseException] = []

    def go(c: Any) -> None:
        try:
            out[c.rank] = body(c)
        except BaseException as e:  # noqa: BLE001 — re-raised below
            errors.append(e)
            c.abort()
    threads = [threading.Thread(target=go, args=(c,), name=f"rank-{c.rank}") for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def record_steps(engine: Engine) -> list[tuple[Step, np.ndarray]]:
    """From now on, every step the engine runs and the float32 logits it produced (filled as it runs)."""
    runner, recorded = engine.runner, []
    execute = runner.execute

    def recording(step: Step, *a: Any, **kw: Any) -> Any:
        launched = execute(step, *a, **kw)
        recorded.append((step, np.asarray(runner.backend.to_host(launched.logits), np.float32).copy()))
        return launched
    runner.execute = recording
    return recorded


class Recorder:
    """Wraps a communicator; keeps what this rank contributed to each all_reduce and the sum it got, and
    counts its broadcasts."""

    def __init__(self, comm: Any) -> None:
        self.comm, self.rank, self.world_size = comm, comm.rank, comm.world_size
        self.reduced: list[tuple[np.ndarray, np.ndarray]] = []
        self.broadcasts = 0

    def broadcast(self, x: Any, root: int = 0) -> Any:
        self.broadcasts += 1
        return self.comm.broadcast(x, root)

    def all_reduce(self, x: Any) -> Any:
        mine = np.array(x, np.float32)
        out = self.comm.all_reduce(x)
        self.reduced.append((mine, np.array(out, np.float32)))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.comm, name)


def replay_on_ranks(model: str | None, args: EngineArgs, plugins: Plugins, steps: Sequence[tuple[Step, Any]],
                    world_size: int, graphs: bool = False) -> tuple[list[list[np.ndarray]], list[Recorder]]:
    """Load `model` on `world_size` expert-parallel ranks (threads, in-process group) and run the recorded
    steps on every rank: (each rank's logits of each step, each rank's recorded all_reduces). `graphs`: the
    ranks decode through emulated graphs (testing/graphs.py), as an engine given `emulate_graphs` does."""
    ep_args = replace(args, ep=world_size)
    comms = [Recorder(c) for c in LocalGroup(world_size).communicators]

    def rank(comm: Recorder) -> list[np.ndarray]:
        ranked = load_rank(read_source(model, ep_args, plugins), ep_args, comm.rank, lambda backend: comm)
        runner = ranked.runner
        if graphs:
            runner.graphs = EmulatedGraphs(runner._forward, args.max_num_seqs, ranked.max_len, runner.block_size,
                                           bool(runner.pools.slots))
        logits, prev = [], None
        for step, _ in steps:
            prev = runner.execute(step, prev=prev)
            logits.append(np.asarray(runner.backend.to_host(prev.logits), np.float32).copy())
        return logits
    return run_ranks(comms, rank), comms


def assert_logits_match(want: Sequence[np.ndarray], got: Sequence[np.ndarray], rtol: float = 1e-5) -> None:
    """Step by step, logits within rtol of the largest (an expert-parallel sum adds in another order) and
    the same greedy tokens."""
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.shape == w.shape
        if not w.size:   # a prefill chunk that samples no row
            continue
        np.testing.assert_allclose(g, w, rtol=0, atol=rtol * float(np.abs(w).max()))
        assert (g.argmax(-1) == w.argmax(-1)).all()


def assert_ranks_match(steps: Sequence[tuple[Step, np.ndarray]], per_rank: list[list[np.ndarray]],
                       recorders: list[Recorder], rtol: float = 1e-5) -> None:
    """Every rank's logits equal (the same all_reduce on each) and close to EP = 1's (`assert_logits_match`);
    and the experts really are split: every rank contributed a partial output of its own to the MoE sums
    (a rank holding every expert, or none, would contribute all or nothing)."""
    for r, logits in enumerate(per_rank[1:], 1):
        for a, b in zip(per_rank[0], logits):
            np.testing.assert_array_equal(a, b, err_msg=f"rank {r}'s logits differ from rank 0's")
    assert_logits_match([w for _, w in steps], per_rank[0], rtol)
    for rec in recorders:
        assert rec.reduced, "the model never summed its experts over the ranks"
        partial = [(mine, total) for mine, total in rec.reduced if np.abs(mine).max() > 0]
        assert partial and any(not np.allclose(mine, total) for mine, total in partial), \
            f"rank {rec.rank} did not contribute a share of the experts"
