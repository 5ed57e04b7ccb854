"""`openinfer serve --ep 2` on the CPU: it serves from one HTTP process with a worker process for rank 1; a
killed worker fails the request in flight with an error naming the rank, and the server exits with status 1."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

START_TIMEOUT_S = 120   # generous: CI machines are slow; the server is normally up in a few seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned_children(pid: int) -> list[int]:
    """The server's multiprocessing workers (spawned: `spawn_main` on their command line)."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(k) for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


def test_serve_ep2_dies_with_its_worker(lite, tmp_path):
    ckpt, _ = lite
    port = _free_port()
    log = open(tmp_path / "server.log", "w+")
    server = subprocess.Popen([sys.executable, "-m", "openinfer", "serve", "--model", f"tiny={ckpt}", "--ep", "2",
                               "--port", str(port), "--disable-log-stats"],
                              stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert server.poll() is None, f"the server exited early:\n{(tmp_path / 'server.log').read_text()}"
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        [worker] = _spawned_children(server.pid)
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        events = []
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                events.append(json.loads(line[6:]))
                if len(events) == 3:
                    os.kill(worker, signal.SIGKILL)
        assert "choices" in events[0] and "error" in events[-1]
        assert "expert-parallel rank 1" in events[-1]["error"]["message"]
        assert server.wait(timeout=60) == 1
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        log.close()
