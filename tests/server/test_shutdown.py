"""SIGTERM on a real server process under load: what finishes within the grace period finishes; what is still
running at its end gets a 503 (an error event in a stream); the engines shut down and the process exits 0."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from server_harness import wait_until

CHILD = """
import logging, sys
sys.path.insert(0, {tests!r})
from fake_engine import FakeEngine
from openinfer.server import ModelHost, serve
logging.basicConfig(level=logging.INFO)
engine = FakeEngine("fake", step_s=0.05)
engine.say("x", eos=False)   # then filler tokens up to max_tokens
sys.exit(serve(ModelHost({{"fake": engine}}), "127.0.0.1", {port}, "info", shutdown_timeout=3.0, log_stats=False))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _running(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running"))


def test_sigterm_drains_interrupts_the_rest_and_exits_0() -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=str(Path(__file__).parent), port=port)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_until(lambda: _answers(url), timeout=60), "the server did not start"
        results: dict[str, object] = {}

        def short() -> None:
            results["short"] = httpx.post(url + "/v1/completions", timeout=60,
                                          json={"model": "fake", "prompt": "a", "max_tokens": 10}).json()

        def long() -> None:
            results["long"] = httpx.post(url + "/v1/completions", timeout=60,
                                         json={"model": "fake", "prompt": "a", "max_tokens": 2000})

        def stream() -> None:
            with httpx.stream("POST", url + "/v1/chat/completions", timeout=60,
                              json={"model": "fake", "messages": [{"role": "user", "content": "Hi"}],
                                    "max_tokens": 2000, "stream": True}) as r:
                results["stream"] = [line for line in r.iter_lines() if line]

        threads = [threading.Thread(target=f) for f in (short, long, stream)]
        for t in threads:
            t.start()
        assert wait_until(lambda: _running(url) == 3, timeout=30)
        child.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        output, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, output
    assert "engines shut down" in output
    assert results["short"]["usage"]["completion_tokens"] == 10          # finished within the grace period
    long_answer = results["long"]
    assert long_answer.status_code == 503 and long_answer.json()["error"]["code"] == "server_shutting_down"
    events = results["stream"]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "server_shutting_down"
    assert len(events) > 3   # it had been streaming


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/live").status_code == 200
    except httpx.HTTPError:
        return False
