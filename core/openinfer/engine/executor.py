"""The executor: runs each step the engine decides on every rank of its model.

Rank 0's ModelRunner lives in the engine's process (it returns the logits and tokens: they are the
same on every rank); ranks 1..N-1 are worker processes (parallel/workers.py), one per device, that
receive each step's inputs and run the same forward on their device with their shard of the
experts, meeting rank 0 in the MoE layers' collectives. A single device is the case of no workers.
"""
from __future__ import annotations

from .model_runner import Launched, ModelRunner, Step, StepOutput
from ..parallel.communicator import RankFailed
from ..parallel.workers import DEATH_NOTICE_S, Workers
from ..sampling.batch import SamplingBatch
from .scheduler import StepPlan


class Executor:
    def __init__(self, runner: ModelRunner, workers: Workers | None = None) -> None:
        self.runner, self.workers = runner, workers

    @property
    def world_size(self) -> int:
        return 1 if self.workers is None else self.workers.world_size

    def launch(self, plan: StepPlan, sampling: SamplingBatch | None = None) -> Launched:
        return self._run(self.runner.step(plan), sampling)

    def launch_next(self, plan: StepPlan, prev: Launched) -> Launched:
        return self._run(Step(self.runner.next_host(plan, prev.host), follows=True), prev=prev)

    def collect(self, step: Launched, logits_rows: list[int] | tuple[int, ...] = ()) -> StepOutput:
        out = self.runner.collect(step, logits_rows)
        self.check()   # a rank that died during the step leaves its results meaningless
        return out

    def check(self) -> None:
        """Raise RankFailed if a worker died."""
        if self.workers is not None:
            self.workers.check()

    def shutdown(self) -> None:
        if self.workers is not None:
            self.workers.shutdown()

    def _run(self, step: Step, sampling: SamplingBatch | None = None, prev: Launched | None = None) -> Launched:
        if self.workers is None:
            return self.runner.execute(step, sampling, prev)
        self.workers.send(step)
        try:
            return self.runner.execute(step, sampling, prev)
        except RankFailed:
            self.workers.check(DEATH_NOTICE_S)   # the watchdog's reason: which rank, how it ended
            raise
        except Exception as e:
            # the workers ran (or are running) this step's collectives: the ranks no longer pair up
            raise RankFailed(f"rank 0 failed mid-step, so the expert-parallel ranks are out of step: "
                             f"{type(e).__name__}: {e}") from e
