"""`bench startup` against a tiny python server command, `bench prefix` against the stub."""

from __future__ import annotations

import json
import math
import os
import socket
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from openinfer.bench.prefix import Sample, summarize_ladder
from openinfer.bench.startup import frameworks_in, frameworks_mapped, rss_bytes, tree_pids


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_startup_probe(tmp_path: Path) -> None:
    port = _free_port()
    out = tmp_path / "startup.json"
    script = str(Path(__file__).with_name("tiny_server.py"))
    rc = run_cli("bench", "startup", "--base-url", f"http://127.0.0.1:{port}", "--idle-wait", "0.1", "--burst", "4",
                 "--burst-output-len", "3", "--timeout", "30", "--output-json", str(out),
                 "--server-log", str(tmp_path / "server.log"), "--", sys.executable, script, str(port))
    assert rc == 0
    assert b"tiny server listening" in (tmp_path / "server.log").read_bytes()
    res = json.loads(out.read_text())
    assert res["ready_s"] > 0 and res["idle_rss_mb"] > 0
    assert res["idle_processes"] == 2  # the server and its child
    assert res["frameworks_loaded"] == []
    assert res["burst_requests"] == 4 and res["burst_failed"] == 0
    assert res["burst_peak_rss_mb"] >= res["idle_rss_mb"] * 0.5 and res["after_burst_rss_mb"] > 0
    assert res["exit_code"] == 0  # SIGTERM handled: a clean exit
    for pid in res["pids"]:  # the whole tree is gone
        assert rss_bytes(pid) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_serve_never_loads_a_model_framework(tmp_path: Path) -> None:
    """The real `openinfer serve` (built-in demo model, CPU), started by `bench startup` in an environment
    that has torch installed (the test dependencies): nothing of torch is mapped into the server."""
    port = _free_port()
    out = tmp_path / "startup.json"
    rc = run_cli("bench", "startup", "--base-url", f"http://127.0.0.1:{port}", "--idle-wait", "0.1", "--burst", "0",
                 "--timeout", "120", "--output-json", str(out), "--server-log", str(tmp_path / "server.log"), "--",
                 sys.executable, "-m", "openinfer", "serve", "--port", str(port), "--device", "cpu")
    assert rc == 0, (tmp_path / "server.log").read_text()
    res = json.loads(out.read_text())
    assert res["ready_s"] > 0 and res["idle_processes"] == 1
    assert res["frameworks_loaded"] == []


def test_startup_reports_a_dead_server(tmp_path: Path) -> None:
    rc = run_cli("bench", "startup", "--base-url", f"http://127.0.0.1:{_free_port()}", "--timeout", "10", "--",
                 sys.executable, "-c", "import sys; print('boom'); sys.exit(3)")
    assert rc == 1
    assert run_cli("bench", "startup") == 2  # no command


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_frameworks_mapped_sees_torch_in_a_process_that_imported_it() -> None:
    """The check the `serve` start-up figures rely on: it must see torch where torch was imported."""
    pytest.importorskip("torch")
    import subprocess
    proc = subprocess.Popen([sys.executable, "-c", "import torch, sys; print('up', flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"
        assert frameworks_mapped([proc.pid]) == ["torch"]
    finally:
        proc.stdin.close()
        proc.wait()
    assert frameworks_mapped([os.getpid()]) == sorted(n for n in ("torch",) if n in sys.modules)


def test_frameworks_in_reads_package_folders_only() -> None:
    """The H200 image's venv lives at /opt/torch/.venv: its cupy files are not torch's (reading the
    path's words alone finds "torch" for a server that never imported it)."""
    venv = "7f00-7f01 r-xp 00000000 00:2a 1 /opt/torch/.venv/lib/python3.12/site-packages/"
    assert frameworks_in(venv + "cupy/_core/core.so\n") == set()
    assert frameworks_in(venv + "torch/lib/libtorch_cpu.so\n") == {"torch"}
    assert frameworks_in("7f00-7f01 r-xp 0 00:2a 1 /usr/lib/python3/dist-packages/jaxlib/x.so\n") == {"jaxlib"}


def test_tree_pids_of_self() -> None:
    assert tree_pids(os.getpid())[0] == os.getpid() and rss_bytes(os.getpid()) > 0


def test_ladder_summary_exact() -> None:
    samples = [Sample(8, "cold", t, 0) for t in (0.1, 0.2, 0.3, 0.4)] + [Sample(8, "warm", 0.01, 7)]
    cold, warm = summarize_ladder(samples)
    assert (cold.tier, cold.n, warm.tier, warm.n) == ("cold", 4, "warm", 1)
    assert cold.p50_ttft_ms == pytest.approx(250.0) and cold.p99_ttft_ms == pytest.approx(397.0)
    assert cold.mean_ttft_ms == pytest.approx(250.0) and warm.median_cached_tokens == 7


def test_prefix_ladder(stub, tmp_path: Path) -> None:
    url, state = stub
    out = tmp_path / "prefix.json"
    rc = run_cli("bench", "prefix", "--base-url", url, "--lengths", "32,64", "--repeats", "3", "--vocab-size", "1000",
                 "--host-restore", "--evict-tokens", "100", "--output-json", str(out))
    assert rc == 0
    res = json.loads(out.read_text())
    rows = {(r["length"], r["tier"]): r for r in res["results"]}
    assert set(rows) == {(n, t) for n in (32, 64) for t in ("cold", "warm", "host")}
    for n in (32, 64):
        assert rows[(n, "cold")]["median_cached_tokens"] == 0
        assert rows[(n, "warm")]["median_cached_tokens"] == n - 1  # all but the last token
        assert rows[(n, "host")]["median_cached_tokens"] == n - 1  # the stub never evicts
        assert all(r["n"] == 3 and r["p99_ttft_ms"] >= r["p50_ttft_ms"] > 0 for k, r in rows.items() if k[0] == n)
    # one unmeasured first request, then per rep: cold, warm, ceil(100 / n) fillers, host
    assert len(state.bodies) == 1 + 3 * (3 + 4) + 3 * (3 + 2)
    cold = [tuple(b["prompt"]) for b, rid in zip(state.bodies, state.request_ids) if "cold" in rid]
    assert len(cold) == 6 and len(set(cold)) == 6 and all(b["max_tokens"] == 1 for b in state.bodies)


def test_prefix_host_rung_sizes_the_fillers_from_the_server(stub) -> None:
    url, state = stub
    args = ("bench", "prefix", "--base-url", url, "--lengths", "32", "--repeats", "1", "--host-restore")
    assert run_cli(*args) == 1                       # no --evict-tokens and no pool size on /metrics
    state.pool_blocks, state.bodies = 10, []         # 160 tokens: fillers of 160 + 32 tokens
    assert run_cli(*args) == 0
    assert len(state.bodies) == 1 + 2 + math.ceil(192 / 32) + 1
