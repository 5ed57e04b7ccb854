"""Expert parallelism on the CPU with the MoE stand-in line: EP = 2, 4 and 8 give EP = 1's logits and greedy
tokens; worker processes (2 and 8) run the engine's steps; a dead rank kills the engine; bad --ep values are refused
before anything loads."""
from __future__ import annotations

import os
import signal

import pytest
from ep_standin import FAIL_RANK, NAME
from starlette.testclient import TestClient

from openinfer.cli import _engine_args, build_parser
from openinfer.engine.engine import build_engine
from openinfer.engine.engine_args import EngineArgs
from openinfer.loading.loader import LoadError
from openinfer.engine.request import Failed, Tokens
from openinfer.server import ModelHost
from openinfer.server.app import create_app
from openinfer.testing.engine import generate, greedy
from openinfer.testing.graphs import emulate_graphs
from openinfer.testing.parallel import assert_logits_match, assert_ranks_match, record_steps, replay_on_ranks

# a 16-token budget chunks the long prompts; the third shares the first's prefix (a prefix-cache hit)
ARGS = EngineArgs(load_format="dummy", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=16)
LONG = [(7 * i) % 500 + 1 for i in range(40)]
FIRST = [LONG, [5, 6, 7]]
SECOND = [LONG[:33] + [9, 9, 9]]


def _run(engine):
    tokens = [t for t, _, _ in generate(engine, FIRST, greedy(6))]
    second = generate(engine, SECOND, greedy(6))
    assert second[0][2] > 0   # the prefix cache served part of it
    return tokens + [second[0][0]]


@pytest.fixture(scope="module")
def ep1(standin_plugins):
    engine = build_engine(NAME, ARGS, standin_plugins)
    steps = record_steps(engine)
    tokens = _run(engine)
    engine.shutdown()
    return steps, tokens


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_in_process_ranks_give_ep1_logits(standin_plugins, ep1, world_size):
    steps, _ = ep1
    per_rank, recorders = replay_on_ranks(NAME, ARGS, standin_plugins, steps, world_size)
    assert_ranks_match(steps, per_rank, recorders)


def test_pipelined_graph_decode_on_ranks(standin_plugins):
    """Decode steps queued before the previous one's tokens reach the host (emulated graphs): every rank
    feeds rank 0's tokens, and the logits stay EP = 1's."""
    engine = build_engine(NAME, ARGS, standin_plugins)
    emulate_graphs(engine)
    steps = record_steps(engine)
    generate(engine, [[3, 4, 5], [6, 7]], greedy(6))
    engine.shutdown()
    follows = sum(step.follows for step, _ in steps)
    assert follows
    per_rank, recorders = replay_on_ranks(NAME, ARGS, standin_plugins, steps, 2, graphs=True)
    assert_ranks_match(steps, per_rank, recorders)
    assert [r.broadcasts for r in recorders] == [follows, follows]


@pytest.mark.parametrize("ep", [2, 8])
def test_worker_processes_give_ep1_tokens(standin_plugins, ep1, ep):
    engine = build_engine(NAME, EngineArgs(**{**vars(ARGS), "ep": ep}), standin_plugins)
    try:
        assert engine.executor.world_size == ep
        steps = record_steps(engine)
        assert _run(engine) == ep1[1]
        assert_logits_match([w for _, w in ep1[0]], [g for _, g in steps])
    finally:
        engine.shutdown()
    assert not engine.executor.workers.procs[0].is_alive()


def test_a_killed_worker_fails_the_requests_and_the_engine(standin_plugins):
    engine = build_engine(NAME, EngineArgs(**{**vars(ARGS), "ep": 2, "max_model_len": 4096}),
                          standin_plugins).start()
    host = ModelHost()
    host.add(engine)
    try:
        worker = engine.executor.workers.procs[0]
        stream = engine.submit([1, 2, 3], greedy(4000))
        events = []
        for ev in stream:
            events.append(ev)
            if len(events) == 4:   # mid-generation
                os.kill(worker.pid, signal.SIGKILL)
        assert all(isinstance(ev, Tokens) for ev in events[1:-1]) and isinstance(events[-1], Failed)
        assert f"expert-parallel rank 1 (pid {worker.pid}) died" in events[-1].message
        assert not engine.is_alive()
        refused = engine.submit([1, 2], greedy(2)).drain()
        assert isinstance(refused[-1], Failed) and "rank 1" in refused[-1].message
        health = TestClient(create_app(host)).get("/health")
        assert health.status_code == 503 and "rank 1" in health.json()["error"]["message"]
    finally:
        engine.shutdown()


def test_a_worker_that_fails_to_load_fails_the_load(standin_plugins, monkeypatch):
    monkeypatch.setenv(FAIL_RANK, "1")
    with pytest.raises(LoadError, match="expert-parallel rank 1 failed to load: RuntimeError: rank 1 was told to fail"):
        build_engine(NAME, EngineArgs(**{**vars(ARGS), "ep": 2}), standin_plugins)


def test_refusals_before_anything_loads(standin_plugins, monkeypatch):
    def no_workers(*a, **kw):
        raise AssertionError("workers started before the refusal")
    monkeypatch.setattr("openinfer.parallel.workers.Workers.__init__", no_workers)
    with pytest.raises(LoadError, match="--ep 3 does not divide the model's 8 routed experts"):
        build_engine(NAME, EngineArgs(**{**vars(ARGS), "ep": 3}), standin_plugins)
    with pytest.raises(LoadError, match="has no routed experts"):
        build_engine(None, EngineArgs(ep=2), standin_plugins)   # the dense demo model
    monkeypatch.setattr("openinfer.loading.loader._visible_gpus", lambda: 2)
    with pytest.raises(LoadError, match=r"--ep 2 from cuda:1 needs GPUs 1..2, but 2 GPU\(s\) are visible"):
        build_engine(NAME, EngineArgs(**{**vars(ARGS), "device": "cuda:1", "ep": 2}), standin_plugins)
    with pytest.raises(ValueError, match="kv_offload is not available with expert parallelism"):
        EngineArgs(ep=2, kv_offload=True)
    with pytest.raises(ValueError, match="ep must be >= 1"):
        EngineArgs(ep=0)


def test_cli_flag():
    assert _engine_args(build_parser().parse_args(["serve", "--ep", "4"])).ep == 4
    assert _engine_args(build_parser().parse_args(["generate", "hi"])).ep == 1
