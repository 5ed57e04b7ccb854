"""A client that goes away aborts its engine requests — streaming or not, running or still queued —
and a request that finished normally is never aborted."""
from __future__ import annotations

import pytest

from fake_engine import FakeEngine
from server_harness import post, wait_until


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi", "n": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
])
def test_disconnect_aborts_running_requests(server: str, fake: FakeEngine, path: str, body: dict,
                                            stream: bool) -> None:
    fake.step_s = 0.005
    sock = post(server, path, {**body, "model": "fake", "max_tokens": 3000, "stream": stream})
    n = body.get("n", 1)
    assert wait_until(lambda: len(fake.submitted) == n and fake.stats().num_running == n)
    if stream:
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.close()
    rids = sorted(rid for rid, _, _ in fake.submitted)
    assert wait_until(lambda: sorted(fake.aborted) == rids)
    assert wait_until(lambda: fake.stats().kv_usage == 0.0 and fake.stats().num_running == 0)


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_aborts_queued_request(server: str, fake: FakeEngine, stream: bool) -> None:
    fake.paused = True
    sock = post(server, "/v1/completions", {"model": "fake", "prompt": "hi", "max_tokens": 10, "stream": stream})
    assert wait_until(lambda: fake.stats().num_waiting == 1)
    sock.close()
    assert wait_until(lambda: fake.aborted == [fake.submitted[0][0]])
    assert wait_until(lambda: fake.stats().num_waiting == 0)


def test_finished_requests_are_not_aborted(server: str, fake: FakeEngine) -> None:
    for stream in (True, False):
        sock = post(server, "/v1/completions", {"model": "fake", "prompt": "hi", "stream": stream})
        data = b""
        while b"[DONE]" not in data and b'"usage"' not in data:
            data += sock.recv(65536)
        sock.close()
    assert wait_until(lambda: fake.stats().num_running == 0)
    assert len(fake.submitted) == 2 and fake.aborted == []
