"""The CI's short fuzz pass over the five request endpoints (openinfer.testing.fuzz; the release soak is
scripts/soak.py), against the real engine (the demo model): only 200s and 4xx in the OpenAI envelope, no error
event after a 200, no dropped connection, and a server that still answers, its KV back to idle. And the one
tenant leak the fuzzer cannot see: another API key's cached prefix must not show in usage.cached_tokens."""
from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from openinfer.engine.engine import Engine
from openinfer.server import ModelHost
from openinfer.testing.fuzz import fuzz
from server_harness import LiveServer, wait_until

SHORT_PASS = 250   # bodies; the release soak sends 2600 and more


def test_a_short_fuzz_pass_leaves_a_live_server(url: str, engine: Engine) -> None:
    report = fuzz(url, "demo", seed=0, count=SHORT_PASS)
    assert report.tried == SHORT_PASS
    assert not report.faults, "\n".join(report.faults)
    assert set(report.statuses) <= {200, 400, 404, 408, 413}, report.statuses
    assert report.statuses[200] > 0 and report.statuses[400] > 0
    assert httpx.get(url + "/health").status_code == 200
    r = httpx.post(url + "/v1/chat/completions", json={"model": "demo", "max_tokens": 2,
                                                       "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200
    assert wait_until(lambda: engine.stats().num_running == 0 and engine.stats().num_waiting == 0)


@pytest.fixture(scope="module")
def keyed(engine: Engine) -> Iterator[str]:
    with LiveServer(ModelHost({"demo": engine}), api_keys=("sk-a", "sk-b")) as url:
        yield url


def test_another_keys_cached_prefix_does_not_show(keyed: str) -> None:
    prompt = "The secret code is 4711. " * 8   # a few blocks

    def cached(key: str) -> int:
        r = httpx.post(keyed + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "demo", "prompt": prompt, "max_tokens": 1})
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached("sk-a")
    assert cached("sk-b") == 0
    assert cached("sk-a") > 0 and cached("sk-b") > 0   # each key hits its own
