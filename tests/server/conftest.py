"""Fixtures: one live server over two fake engines for the session; engines reset per test. Modules that
drive the real engine take `engine` and `url`: the built-in demo model (tiny random Qwen3, real
tokenizer) behind its own server, one per module."""
from __future__ import annotations

from typing import Iterator

import httpx
import openai
import pytest

from fake_engine import FakeEngine
from openinfer.engine.engine import Engine, EngineArgs, build_engine
from openinfer.server import ModelHost
from server_harness import LiveServer


@pytest.fixture(scope="session")
def engines() -> Iterator[dict[str, FakeEngine]]:
    es = {"fake": FakeEngine("fake"), "other": FakeEngine("other", max_model_len=64)}
    for e in es.values():
        e.start()
    yield es
    for e in es.values():
        e.shutdown()


@pytest.fixture(scope="session")
def server(engines: dict[str, FakeEngine]) -> Iterator[str]:
    with LiveServer(ModelHost(engines)) as url:
        yield url


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    e = build_engine(None, EngineArgs(max_model_len=512, kv_cache_memory_gib=0.05)).start()
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with LiveServer(ModelHost({"demo": engine})) as url:
        yield url


@pytest.fixture
def fake(engines: dict[str, FakeEngine]) -> FakeEngine:
    for e in engines.values():
        e.reset()
    return engines["fake"]


@pytest.fixture
def client(server: str, fake: FakeEngine) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0) as c:
        yield c


@pytest.fixture
def http(server: str, fake: FakeEngine) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=30) as c:
        yield c
