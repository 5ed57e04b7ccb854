"""The periodic stats line: rates over the interval, one line per engine (aliases once), idle engines silent,
and the thread logging until stopped."""
from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from openinfer.server import ModelHost
from openinfer.server.stats_log import StatsLogger


def stub(**counters: float) -> SimpleNamespace:
    stats = SimpleNamespace(**{**dict(num_running=0, num_waiting=0, kv_usage=0.0, prefix_queries=0, prefix_hits=0,
                                      prompt_tokens=0, generation_tokens=0), **counters})
    return SimpleNamespace(name="stub", stats=lambda: stats, state=stats)


def test_a_line_per_busy_engine_with_the_intervals_rates() -> None:
    busy, idle = stub(), stub()
    logger = StatsLogger(ModelHost({"qwen": busy, "alias": busy, "other": idle}))
    assert logger.lines(now=100.0) == []   # nothing happened yet
    s = busy.state
    s.prompt_tokens, s.generation_tokens, s.prefix_queries, s.prefix_hits = 1000, 500, 800, 200
    s.num_running, s.num_waiting, s.kv_usage = 2, 1, 0.25
    assert logger.lines(now=110.0) == [
        "qwen: prompt 100.0 tokens/s, generation 50.0 tokens/s, running 2, waiting 1, KV cache 25.0 %, "
        "prefix-cache hits 25.0 % of 800 prompt tokens"]
    s.generation_tokens += 40   # decoding on, no new prompts
    assert logger.lines(now=120.0) == [
        "qwen: prompt 0.0 tokens/s, generation 4.0 tokens/s, running 2, waiting 1, KV cache 25.0 %, "
        "no prefix-cache lookups"]
    s.num_running = s.num_waiting = 0
    assert logger.lines(now=130.0) == []   # idle again: silent


def test_the_thread_logs_until_stopped(caplog: pytest.LogCaptureFixture) -> None:
    engine = stub(num_running=1)
    with caplog.at_level(logging.INFO, logger="openinfer.stats"):
        logger = StatsLogger(ModelHost({"m": engine}), interval=0.02).start()
        deadline = time.monotonic() + 5
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
        logger.stop()
    assert caplog.records and caplog.records[0].getMessage().startswith("m: prompt 0.0 tokens/s")
    count = len(caplog.records)
    time.sleep(0.1)
    assert len(caplog.records) == count   # stopped
