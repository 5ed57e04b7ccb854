"""Drive a pipelined and a serial engine through the same script and compare every stream.

Both engines decode through graphs (on the CPU, emulated ones: testing/graphs.py), so the
pipelined one takes its pipelined path; `launch_next` is counted to show it did. A script maps a
step index to actions (submit, abort) run before that step, the same on both engines; each
stream's events must match.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..engine.engine import Engine
from ..engine.request import Event, RequestStream
from ..sampling.sampler import SamplingParams

Action = Callable[[Engine, dict[str, RequestStream]], None]


def submit(rid: str, prompt: Sequence[int], params: SamplingParams) -> Action:
    def act(engine: Engine, streams: dict[str, RequestStream]) -> None:
        streams[rid] = engine.submit(list(prompt), params, request_id=rid)
    return act


def abort(rid: str) -> Action:
    return lambda engine, streams: engine.abort(rid)


def run_script(engine: Engine, script: dict[int, list[Action]], max_steps: int = 500) -> dict[str, list[Event]]:
    """Every stream's events, the script's actions run before their steps."""
    streams: dict[str, RequestStream] = {}
    step = 0
    while step <= max(script) or engine.has_unfinished():
        for act in script.get(step, []):
            act(engine, streams)
        engine.step()
        step += 1
        assert step < max_steps, "the engine did not finish the script"
    assert all(s.done for s in streams.values()), "the engine went idle with unfinished streams"
    return {rid: s.drain() for rid, s in streams.items()}


def pipelined_launches(engine: Engine) -> list[int]:
    """Count the engine's pipelined launches (the batch of each)."""
    executor, launches = engine.executor, []
    launch_next = executor.launch_next

    def counted(plan, prev):
        launches.append(len(plan.runs))
        return launch_next(plan, prev)
    executor.launch_next = counted
    return launches
