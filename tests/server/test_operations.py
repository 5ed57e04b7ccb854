"""What an operator of the server relies on: API keys (/metrics behind them unless public), CORS for browsers, a
bound on the waiting queue (503 + Retry-After), the probes (/health, /live, /ping, /version) and the limits and the
shutdown grace period reaching uvicorn."""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Iterator

import httpx
import openai
import pytest

from fake_engine import FakeEngine
from openinfer import cli
from openinfer.server import ModelHost
from openinfer.server import run as server_run
from openinfer.server.limits import MIB, ServerLimits
from server_harness import LiveServer, wait_until

KEYS = ("sk-first", "sk-second")


@pytest.fixture(scope="module")
def quiet() -> Iterator[FakeEngine]:
    e = FakeEngine("quiet")
    e.start()
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def keyed(quiet: FakeEngine) -> Iterator[str]:
    with LiveServer(ModelHost({"quiet": quiet}), api_keys=KEYS) as url:
        yield url


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "sk-first"},
                                     {"Authorization": "Basic sk-first"}, {"Authorization": "Bearer sk-first2"}])
@pytest.mark.parametrize("path", ["/v1/models", "/v1/completions", "/tokenize", "/no/such/path"])
def test_a_request_without_a_valid_key_is_a_401(keyed: str, quiet: FakeEngine, headers: dict, path: str) -> None:
    quiet.reset()
    r = httpx.post(keyed + path, json={"model": "quiet", "prompt": "hi"}, headers=headers) if path != "/v1/models" \
        else httpx.get(keyed + path, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {"error": {"message": r.json()["error"]["message"], "type": "invalid_request_error",
                                  "param": None, "code": "invalid_api_key"}}
    assert "Authorization: Bearer" in r.json()["error"]["message"]
    assert quiet.submitted == []   # nothing reached the engine


@pytest.mark.parametrize("key", KEYS)
def test_each_key_serves_every_route_streams_included(keyed: str, quiet: FakeEngine, key: str) -> None:
    quiet.reset()
    quiet.say("Hello there.")
    with openai.OpenAI(base_url=keyed + "/v1", api_key=key, max_retries=0) as client:
        assert [m.id for m in client.models.list()] == ["quiet"]
        assert client.completions.create(model="quiet", prompt="hi", max_tokens=8).choices[0].text == "Hello there."
        quiet.say("Streamed.")
        chunks = client.chat.completions.create(model="quiet", messages=[{"role": "user", "content": "hi"}],
                                                stream=True, max_tokens=8)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Streamed."
    r = httpx.post(keyed + "/tokenize", json={"model": "quiet", "prompt": "hi"},
                   headers={"authorization": f"bearer {key}"})
    assert r.status_code == 200 and r.json()["count"] > 0


@pytest.mark.parametrize("path", ["/health", "/live", "/ping", "/version"])
def test_the_probes_need_no_key(keyed: str, path: str) -> None:
    assert httpx.get(keyed + path).status_code == 200


def test_metrics_want_a_key_unless_public(keyed: str, quiet: FakeEngine) -> None:
    assert httpx.get(keyed + "/metrics").status_code == 401
    assert httpx.get(keyed + "/metrics", headers={"Authorization": f"Bearer {KEYS[1]}"}).status_code == 200
    with LiveServer(ModelHost({"quiet": quiet}), api_keys=KEYS, limits=ServerLimits(public_metrics=True)) as url:
        assert httpx.get(url + "/metrics").status_code == 200
        assert httpx.get(url + "/v1/models").status_code == 401


def test_probes_and_version(http: httpx.Client, fake: FakeEngine) -> None:
    version = http.get("/version").json()["version"]
    assert version and version[0].isdigit()
    assert http.post("/ping").status_code == 200
    fake.kill("simulated crash")
    try:
        # readiness fails once the engine died; liveness (the process answers) does not
        assert http.get("/health").status_code == 503 and http.get("/ping").status_code == 503
        assert http.get("/live").status_code == 200
    finally:
        fake.dead_reason = None


def test_a_full_queue_answers_503_with_retry_after_and_recovers(quiet: FakeEngine) -> None:
    quiet.reset()
    quiet.paused = True   # requests wait unscheduled
    with LiveServer(ModelHost({"quiet": quiet}, max_waiting_requests=2)) as url:
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(httpx.post(
            url + "/v1/completions", json={"model": "quiet", "prompt": "hi", "max_tokens": 4}, timeout=30).status_code))
            for _ in range(2)]
        for t in threads:
            t.start()
        assert wait_until(lambda: quiet.stats().num_waiting == 2)
        r = httpx.post(url + "/v1/chat/completions", json={"model": "quiet", "max_tokens": 4,
                                                             "messages": [{"role": "user", "content": "hi"}]},
                       timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        err = r.json()["error"]
        assert err["code"] == "server_overloaded" and err["type"] == "service_unavailable"
        assert "2 requests are already waiting for 'quiet'" in err["message"]
        assert len(quiet.submitted) == 2   # the refused request never reached the engine
        quiet.paused = False
        for t in threads:
            t.join(timeout=30)
        assert results == [200, 200]
        ok = httpx.post(url + "/v1/completions", json={"model": "quiet", "prompt": "hi", "max_tokens": 4})
        assert ok.status_code == 200


def test_browsers_may_call_from_any_origin_by_default_keys_still_apply(keyed: str) -> None:
    origin = {"Origin": "https://ui.example"}
    pre = httpx.options(keyed + "/v1/chat/completions", headers={**origin, "Access-Control-Request-Method": "POST",
                                                                 "Access-Control-Request-Headers": "authorization"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "*"   # a preflight has no key
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    denied = httpx.get(keyed + "/v1/models", headers=origin)
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == "*"   # readable by the page
    ok = httpx.get(keyed + "/v1/models", headers={**origin, "Authorization": "Bearer sk-first"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("origins, origin, allowed", [(("https://ui.example",), "https://ui.example", True),
                                                      (("https://ui.example",), "https://evil.example", False),
                                                      ((), "https://ui.example", False)])
def test_allowed_origins(quiet: FakeEngine, origins: tuple, origin: str, allowed: bool) -> None:
    with LiveServer(ModelHost({"quiet": quiet}), allowed_origins=origins) as url:
        pre = httpx.options(url + "/v1/models", headers={"Origin": origin, "Access-Control-Request-Method": "GET"})
        got = httpx.get(url + "/v1/models", headers={"Origin": origin})
    assert got.status_code == 200
    assert (pre.headers.get("access-control-allow-origin") == origin) is allowed
    assert (got.headers.get("access-control-allow-origin") == origin) is allowed


def test_a_dead_engine_ends_the_server_with_exit_status_1(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine("doomed")
    result: list[int] = []
    with caplog.at_level(logging.ERROR, logger="openinfer.server"):
        t = threading.Thread(target=lambda: result.append(server_run.serve(
            ModelHost({"doomed": engine}), "127.0.0.1", 0, "warning", log_stats=False, shutdown_timeout=1)))
        t.start()
        time.sleep(1.0)   # serving
        assert t.is_alive() and not result
        engine.kill("simulated crash")
        t.join(timeout=10)
    assert result == [server_run.ENGINE_DIED] and not t.is_alive()
    assert any("engine died ('doomed': simulated crash)" in r.getMessage() for r in caplog.records)


def test_an_idle_keep_alive_connection_outlives_the_clients_pool_expiry(keyed: str) -> None:
    """A connection idle past httpx's pool expiry (5 s, the OpenAI SDK's too) still takes a request: the server must
    not be closing it just as such a client reuses it (uvicorn's default keep-alive is those same 5 s)."""
    host, port = keyed.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        for wait in (0.0, 5.5):
            time.sleep(wait)
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            head = sock.recv(4096)
            assert head.startswith(b"HTTP/1.1 200"), head


def test_a_waiting_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_waiting_requests must be at least 1"):
        ModelHost(max_waiting_requests=0)


def test_serve_passes_the_keys_and_the_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    monkeypatch.setattr(server_run.uvicorn.Server, "run", lambda self: seen.update(config=self.config))
    monkeypatch.setattr(server_run, "create_app",
                        lambda host, keys, origins, limits: seen.update(keys=keys, origins=origins, limits=limits)
                        or object())
    monkeypatch.setenv("OPENINFER_API_KEY", "sk-env")
    built = []
    monkeypatch.setattr("openinfer.engine.engine.build_engine",
                        lambda path, args: built.append(args) or FakeEngine("demo"))
    assert cli.main(["serve", "--api-key", "sk-a", "--shutdown-timeout", "12.5", "--max-waiting-requests", "7",
                     "--generation-config", "none"]) == 0
    assert seen["keys"] == ["sk-a", "sk-env"]
    assert seen["config"].timeout_graceful_shutdown == 12.5 + server_run.LAST_WORDS_S
    assert seen["config"].timeout_keep_alive == server_run.KEEP_ALIVE_S
    assert seen["origins"] == ["*"] and seen["limits"] == ServerLimits()
    assert cli.main(["serve", "--max-request-body-mib", "2", "--request-read-timeout", "7", "--max-stored-response-mib",
                     "1", "--public-metrics", "--shared-prefix-cache"]) == 0
    assert seen["limits"] == ServerLimits(2 * MIB, 7.0, MIB, True, True)
    assert cli.main(["serve", "--allowed-origins", "https://a.example", "--allowed-origins", "https://b.example"]) == 0
    assert seen["origins"] == ["https://a.example", "https://b.example"]
    assert cli.main(["serve", "--allowed-origins", "none"]) == 0 and seen["origins"] == []
    assert len(built) == 4   # one engine a serve
    assert built[0].generation_config == "none"


def test_an_empty_api_key_is_an_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delenv("OPENINFER_API_KEY", raising=False)
    assert cli.main(["serve", "--api-key", ""]) == 1
    assert "--api-key needs a non-empty key" in capsys.readouterr().err
