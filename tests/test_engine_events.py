"""Engine behaviour on the demo model: event order, rejection reasons, abort frees KV, sampling
parameters (seeded reproducibility, stop tokens, min_tokens, logprobs)."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from openinfer.engine.engine import EngineArgs, build_engine
from openinfer.engine.request import (EventOrderError, Finished, Rejected, RequestStream, Scheduled, Tokens,
                                      wakeups_batched)
from openinfer.sampling.sampler import ParamError, SamplingParams
from openinfer.testing.engine import collect, generate, greedy, run_to_completion


@pytest.fixture(scope="module")
def engine():
    return build_engine(None, EngineArgs(max_model_len=256, kv_cache_memory_gib=0.01))


PROMPT = [9707, 11, 1879, 0, 358, 1079]


def test_event_order_is_enforced():
    s = RequestStream("x")
    with pytest.raises(EventOrderError):
        s.put(Tokens([1], []))
    s.put(Scheduled(0))
    s.put(Finished("length", 1, 1, 0))
    with pytest.raises(EventOrderError):
        s.put(Tokens([1], []))


def test_a_blocked_reader_wakes_and_drain_takes_what_is_queued():
    s = RequestStream("x")
    got = []
    reader = threading.Thread(target=lambda: got.append(s.get(timeout=10)))
    reader.start()
    for _ in range(10_000):   # put() notifies only a reader already waiting: test that path
        if s._blocked:
            break
        threading.Event().wait(0.001)
    s.put(Scheduled(3))
    reader.join(timeout=10)
    assert got == [Scheduled(3)]
    s.put(Tokens([1], []))
    s.put(Tokens([2], []))
    assert s.drain() == [Tokens([1], []), Tokens([2], [])] and s.drain() == []


def test_a_step_wakes_an_event_loop_once_for_all_its_streams():
    """Readers awaiting aget() on one loop: puts inside wakeups_batched() (as Engine.step does) reach
    the loop in one call_soon_threadsafe; outside, each put wakes its reader itself."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    streams = [RequestStream(f"r{i}") for i in range(3)]
    for s in streams:
        s.put(Scheduled(0))

    async def read_three(s):
        return [await s.aget(), await s.aget(), await s.aget()]

    readers = [asyncio.run_coroutine_threadsafe(read_three(s), loop) for s in streams]
    try:
        for _ in range(10_000):   # every reader has consumed Scheduled and waits on a future
            if all(s._waiter is not None for s in streams):
                break
            threading.Event().wait(0.001)
        calls = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (calls.append(a), real(*a))[1]
        with wakeups_batched():
            for i, s in enumerate(streams):
                s.put(Tokens([i], []))
            assert calls == []          # held until the step ends
        assert len(calls) == 1
        for _ in range(10_000):
            if all(s._waiter is not None for s in streams):
                break
            threading.Event().wait(0.001)
        for s in streams:
            s.put(Finished("length", 1, 1, 0))
        assert len(calls) == 4
        assert [r.result(timeout=10) for r in readers] == [
            [Scheduled(0), Tokens([i], []), Finished("length", 1, 1, 0)] for i in range(3)]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def test_streams_share_one_wake_future():
    """wake_on: one future armed on several streams is resolved by the first put to any of them; a stream that
    already holds an event arms nothing and says so."""
    async def main():
        loop = asyncio.get_running_loop()
        a, b = RequestStream("a"), RequestStream("b")
        wake = loop.create_future()
        assert a.wake_on(loop, wake) and b.wake_on(loop, wake)
        threading.Thread(target=b.put, args=(Scheduled(2),)).start()
        await asyncio.wait_for(wake, 10)
        a.put(Scheduled(1))   # the stale waiter resolves a done future: harmless
        assert not a.wake_on(loop, loop.create_future())
        assert a.drain() == [Scheduled(1)] and b.drain() == [Scheduled(2)]
    asyncio.run(main())


def test_events_arrive_in_order(engine):
    s = engine.submit(PROMPT, greedy(5))
    run_to_completion(engine, [s])
    events = list(s)
    assert isinstance(events[0], Scheduled) and isinstance(events[-1], Finished)
    assert all(isinstance(e, Tokens) for e in events[1:-1]) and len(events) == 7


def test_rejections_name_the_reason(engine):
    [ev] = list(engine.submit(list(range(250)), SamplingParams(max_tokens=10)))
    assert isinstance(ev, Rejected) and ev.param == "max_tokens" and "maximum context length is 256" in ev.reason
    [ev] = list(engine.submit([], SamplingParams()))
    assert isinstance(ev, Rejected) and ev.param == "prompt"
    [ev] = list(engine.submit([10**9], SamplingParams()))
    assert isinstance(ev, Rejected) and "token ids" in ev.reason
    # plain ints take a fast path, anything else the per-id check: both ways, the same verdicts
    for bad in ([1, -1, 2], [1, 2.0], [1, np.int64(2)], [1, "2"], [engine.vocab_size]):
        [ev] = list(engine.submit(bad, SamplingParams()))
        assert isinstance(ev, Rejected) and "token ids" in ev.reason, bad
    for good in ([0, engine.vocab_size - 1], [True, 3]):   # bool is an int
        assert engine.submit(good, SamplingParams(max_tokens=1)).drain() == []   # queued, not rejected
    while engine.has_unfinished():
        engine.step()


def test_priority_policy_admits_by_priority_and_fcfs_refuses_one(engine):
    [ev] = list(engine.submit(PROMPT, greedy(2), priority=1))
    assert isinstance(ev, Rejected) and ev.param == "priority" and "--scheduling-policy priority" in ev.reason
    assert engine.submit(PROMPT, greedy(1), priority=0).drain() == []   # 0 is first come, first served
    run_to_completion(engine, [])
    eng = build_engine(None, EngineArgs(max_model_len=256, kv_cache_memory_gib=0.01, max_num_seqs=1,
                                        scheduling_policy="priority"))
    streams = {name: eng.submit(PROMPT, greedy(3), priority=p) for name, p in (("a", 0), ("b", 5), ("c", -1))}
    started = []   # one place: the requests run one after another, in admission order
    while eng.has_unfinished():
        eng.step()
        started += [name for name, s in streams.items() if any(isinstance(e, Scheduled) for e in s.drain())]
    assert started == ["c", "a", "b"]


def test_kv_budget_rejection():
    small = build_engine(None, EngineArgs(max_model_len=4096, kv_cache_memory_gib=0.0005, block_size=16))
    [ev] = list(small.submit(PROMPT, SamplingParams(max_tokens=3000)))
    assert isinstance(ev, Rejected) and "KV cache" in ev.reason


def test_abort_frees_kv_at_once(engine):
    engine.start()
    try:
        s = engine.submit(PROMPT, greedy(200))
        first = s.get(timeout=30)
        assert isinstance(first, Scheduled)
        s.get(timeout=30)
        assert engine.blocks.usage() > 0
        engine.abort(s.request_id)
        engine.abort(s.request_id)          # idempotent
        rest = list(s)
        assert isinstance(rest[-1], Finished) and rest[-1].reason == "abort"
        deadline = threading.Event()
        for _ in range(100):
            if engine.blocks.usage() == 0.0:
                break
            deadline.wait(0.05)
        assert engine.blocks.usage() == 0.0
    finally:
        engine.shutdown()


def test_seed_reproducible_and_distinct(engine):
    p = dict(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, ignore_eos=True)
    [(a, _, _), (b, _, _), (c, _, _)] = generate(engine, [PROMPT] * 3, [SamplingParams(seed=1, **p),
                                                                       SamplingParams(seed=1, **p),
                                                                       SamplingParams(seed=2, **p)])
    assert a == b and a != c


def test_stop_token_and_min_tokens(engine):
    [(tokens, _, _)] = generate(engine, [PROMPT], greedy(6))
    stop = tokens[2]
    [(t, fin, _)] = generate(engine, [PROMPT], SamplingParams(max_tokens=6, temperature=0, stop_token_ids=[stop],
                                                              ignore_eos=True))
    assert t == tokens[:3] and fin.reason == "stop" and fin.stop_token == stop
    [(t, fin, _)] = generate(engine, [PROMPT], SamplingParams(max_tokens=6, temperature=0, stop_token_ids=[stop],
                                                              min_tokens=4, ignore_eos=True))
    assert stop not in t[:4] and len(t) >= 4


def test_logprobs_are_log_softmax(engine):
    [(t, _, _)] = generate(engine, [PROMPT], greedy(3, logprobs=5))
    s = engine.submit(PROMPT, greedy(3, logprobs=5))
    run_to_completion(engine, [s])
    samples = [smp for ev in s if isinstance(ev, Tokens) for smp in ev.samples]
    for smp in samples:
        assert smp.top[0][0] == smp.token and abs(smp.top[0][1] - smp.logprob) < 1e-6
        assert all(a[1] >= b[1] for a, b in zip(smp.top, smp.top[1:])) and smp.logprob <= 0


def test_parameter_validation_names_the_field():
    for kw, param in [(dict(temperature=3), "temperature"), (dict(top_p=0), "top_p"), (dict(max_tokens=0), "max_tokens"),
                      (dict(logprobs=21), "logprobs"), (dict(logit_bias={10**9: 1.0}), "logit_bias"),
                      (dict(presence_penalty=5), "presence_penalty")]:
        with pytest.raises(ParamError) as e:
            SamplingParams(**kw).validate(1000)
        assert e.value.param == param


def test_penalties_and_bias_change_the_distribution():
    from openinfer.sampling.sampler import sample_row
    rng = np.random.default_rng(0)
    logits = np.zeros(10, dtype=np.float32)
    logits[3] = 5.0
    assert sample_row(logits, SamplingParams(temperature=0), rng, [], []).token == 3
    assert sample_row(logits, SamplingParams(temperature=0, logit_bias={7: 10.0}), rng, [], []).token == 7
    assert sample_row(logits, SamplingParams(temperature=0, frequency_penalty=2.0), rng, [], [3, 3, 3]).token != 3
    assert sample_row(logits, SamplingParams(temperature=0, repetition_penalty=2.0), rng, [3], []).token == 3
    assert sample_row(logits, SamplingParams(temperature=1.0, top_k=1), rng, [], []).token == 3
    assert sample_row(logits, SamplingParams(temperature=1.0, min_p=0.5), rng, [], []).token == 3
