"""The start-up phase log: one INFO line per phase with RSS, background phases, the heap trim."""
from __future__ import annotations

import logging
import threading

import pytest

from openinfer.loading import phases
from openinfer.engine.engine import EngineArgs, build_engine


def test_a_phase_logs_its_time_rss_and_detail(caplog):
    caplog.set_level(logging.INFO, logger="openinfer.startup")
    with phases.phase("unit-test phase") as p:
        p.detail = "42 things"
    assert phases.PHASES[-1] is p and p.seconds >= 0 and p.end >= p.start > 0 and p.thread == ""
    assert p.rss is not None and p.rss.total >= p.rss.anon > 0
    line = caplog.records[-1].getMessage()
    assert line.startswith("start-up: unit-test phase ") and "RSS" in line and line.endswith(": 42 things")


def test_background_phases_name_their_thread_and_pass_errors_on():
    ok = phases.in_background("bg-ok", lambda a, b: (a + b, threading.current_thread().name), 2, 3)
    assert ok.result(timeout=10) == (5, "bg-ok")
    assert next(p for p in reversed(phases.PHASES) if p.name == "bg-ok").thread == "bg-ok"
    failed = phases.in_background("bg-fails", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failed.result(timeout=10)


def test_process_age_counts_the_interpreter_start():
    assert 0 < phases.since_start() < 24 * 3600


def test_releasing_the_free_heap_never_grows_it():
    assert phases.release_free_heap() >= 0


def test_loading_the_demo_model_logs_every_phase(caplog):
    caplog.set_level(logging.INFO, logger="openinfer.startup")
    engine = build_engine(None, EngineArgs(max_model_len=256, kv_cache_memory_gib=0.01))
    names = [r.getMessage().split(" ")[1] for r in caplog.records if r.getMessage().startswith("start-up: ")]
    for name in ("plugins", "config", "tokenizer", "backend", "weights", "KV", "return"):
        assert name in names, names
    weights = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("start-up: weights"))
    assert " GB at " in weights and weights.endswith(" GB/s")
    assert engine.tokenizer.vocab_size > 0
    tokenizer = next(p for p in reversed(phases.PHASES) if p.name == "tokenizer")
    assert tokenizer.thread == "tokenizer"   # parsed beside the device work (loading/loader.py)


def test_an_early_cuda_context_is_only_tried_for_cuda_devices():
    from openinfer.loading.cuda_context import create_context_early
    assert create_context_early("cpu") is None
    started = create_context_early("cuda:0")   # without a driver (CI) it fails quietly: the backend reports
    assert isinstance(started.result(timeout=60), bool)
