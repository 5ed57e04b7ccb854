"""The release soak: an `openinfer serve` process (the demo model unless --model) on loopback, tested as an
attacker and a careless client would. Run before each release; record its summary in docs/hardening.md.

    .venv/bin/python scripts/soak.py --out /tmp/soak.json        # ~10 minutes on 2 CPU cores

Phases, each tallied (statuses, faults, requests lost):
  fuzz         --bodies seeded fuzz bodies over the five request endpoints (openinfer.testing.fuzz)
  raw          malformed HTTP on raw sockets; every answer must be < 500 and the server must go on
  credentials  15 kinds of bad credentials on the API and /metrics: 401 each
  tenants      another key reads, continues, cancels, deletes a stored response: 404 each
  big          a 10 MB prompt (refused before tokenizing), a 10 MB prompt with truncate_prompt_tokens (tokenized off
               the GIL), a 40 MB body (413): /health's slowest answer and a stream's longest gap meanwhile
  slow         clients that never finish their body: 408 after --request-read-timeout
  soak         --soak requests, 32 at a time, 40 % of their clients gone at a random moment; the rest must all be
               answered; then the KV cache must be back to idle
  burst        200 requests at once against --max-waiting-requests: 200 or 503 with Retry-After only
  sigterm      SIGTERM with 24 requests sent (16 of 2000 tokens running): each answered (done, 503 or an error
               event), exit status 0
RSS (VmRSS of the server process) is read idle after start-up and idle before the SIGTERM.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import httpx

from openinfer.testing.fuzz import fuzz

KEYS = ("sk-soak-a", "sk-soak-b")
MODEL = "soak"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}]}


class Server:
    """`openinfer serve` in a child process on a free loopback port."""

    def __init__(self, args: argparse.Namespace) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        model = ["--model", f"{MODEL}={args.model}"] if args.model else []
        cmd = [sys.executable, "-m", "openinfer", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--api-key", KEYS[0], "--api-key", KEYS[1], "--max-waiting-requests", "32",
               "--request-read-timeout", "5", "--shutdown-timeout", "3", "--disable-log-stats", *model,
               *shlex.split(args.serve_args)]
        self.log = open(args.log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.5)
        self.model = args.model and MODEL or httpx.get(self.url + "/v1/models", headers=auth()).json()["data"][0]["id"]

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def gauges(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", headers=auth()).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
                if line.startswith(f"vllm:{name}"):
                    out[name] = out.get(name, 0.0) + float(line.split()[-1])
        return out


def auth(key: str = KEYS[0]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def body(extra: dict[str, Any], model: str) -> dict[str, Any]:
    return {**CHAT, "model": model, **extra}


def phase_fuzz(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    report = fuzz(srv.url, srv.model, args.seed, args.bodies, api_key=KEYS[0], timeout=120)
    return {"bodies": report.tried, "statuses": dict(report.statuses), "faults": report.faults[:20],
            "fault_count": len(report.faults)}


RAW = [b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
       b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
       b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
       b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
       b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n\xff\xfe\xfd\xfc",
       b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi",
       b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
       b"DELETE /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /v1/../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
       b"GET /v1/models HTTP/1.0\r\n\r\n", b"GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n",
       b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 100_000 + b"\r\n\r\n",
       b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
       b"POST /v1/responses/%00/cancel HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
       b"GET /v1/responses/" + "\u00e9".encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n",
       b"OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://a.example\r\n"
       b"Access-Control-Request-Method: POST\r\n\r\n",
       b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{\"a\":1}   ",
       b"POST /detokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}"]


def _raw(srv: Server, data: bytes, key: bool) -> int:
    """The status of one raw request (0: the connection closed without one)."""
    if key:
        data = data.replace(b"Host: x\r\n", b"Host: x\r\nAuthorization: Bearer " + KEYS[0].encode() + b"\r\n", 1)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        try:
            s.sendall(data)
            answer = s.recv(200)
        except OSError:
            return 0
    return int(answer.split()[1]) if answer.startswith(b"HTTP/") else 0


def phase_raw(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    statuses: Counter[int] = Counter()
    for data in RAW:
        for key in (False, True):
            statuses[_raw(srv, data, key)] += 1
    pipelined = (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n{" +
                 b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    statuses[_raw(srv, pipelined, True)] += 1
    alive = httpx.get(srv.url + "/health").status_code == 200
    return {"cases": sum(statuses.values()), "statuses": dict(statuses),
            "fault_count": sum(n for s, n in statuses.items() if s >= 500) + (not alive)}


BAD_KEYS = [None, "", "Bearer", "Bearer ", f"Bearer {KEYS[0]} ", f"bearer{KEYS[0]}", f"Basic {KEYS[0]}",
            f"Bearer {KEYS[0][:-1]}", f"Bearer {KEYS[0]}x", f"Bearer {KEYS[0].upper()}", "Bearer \x00",
            f"Bearer {KEYS[0]},{KEYS[1]}", "Bearer " + "a" * 10_000, f"Token {KEYS[0]}", KEYS[0]]


def phase_credentials(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    for value in BAD_KEYS:
        headers = {} if value is None else {"Authorization": value}
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/metrics"), ("GET", "/v1/models")):
            try:
                statuses[str(httpx.request(method, srv.url + path, headers=headers,
                                           json=body({"max_tokens": 2}, srv.model)).status_code)] += 1
            except httpx.LocalProtocolError:   # a header value the client itself will not send
                statuses["not sendable"] += 1
            except httpx.HTTPError:
                statuses["no answer"] += 1
    return {"kinds": len(BAD_KEYS), "statuses": dict(statuses),
            "fault_count": sum(n for s, n in statuses.items() if s not in ("401", "not sendable"))}


def phase_tenants(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    made = httpx.post(srv.url + "/v1/responses", headers=auth(KEYS[0]), timeout=60,
                      json={"model": srv.model, "input": "Hi", "max_output_tokens": 4})
    if made.status_code != 200:   # nothing stored to probe: the phase's one fault
        return {"made": made.status_code, "answer": made.text[:300], "fault_count": 1}
    rid = made.json()["id"]
    statuses = [httpx.request(m, srv.url + p, headers=auth(KEYS[1]), json=b).status_code for m, p, b in (
        ("GET", f"/v1/responses/{rid}", None), ("GET", f"/v1/responses/{rid}/input_items", None),
        ("POST", f"/v1/responses/{rid}/cancel", None), ("DELETE", f"/v1/responses/{rid}", None),
        ("POST", "/v1/responses", {"model": srv.model, "input": "Go on", "previous_response_id": rid}))]
    own = httpx.get(srv.url + f"/v1/responses/{rid}", headers=auth(KEYS[0])).status_code
    return {"other_key": statuses, "own_key": own, "fault_count": sum(s != 404 for s in statuses) + (own != 200)}


def _watch(srv: Server, stop: threading.Event, gaps: dict[str, float]) -> None:
    """/health's slowest answer and a running stream's longest gap between chunks, until `stop`."""
    def probes() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            httpx.get(srv.url + "/health", timeout=120)
            gaps["health_max_s"] = max(gaps.get("health_max_s", 0.0), time.perf_counter() - t)
            time.sleep(0.05)

    def stream() -> None:
        while not stop.is_set():
            with httpx.stream("POST", srv.url + "/v1/chat/completions", headers=auth(), timeout=120,
                              json=body({"max_tokens": 200, "stream": True, "ignore_eos": True}, srv.model)) as r:
                last = time.perf_counter()
                for _ in r.iter_lines():
                    now = time.perf_counter()
                    gaps["stream_gap_max_s"] = max(gaps.get("stream_gap_max_s", 0.0), now - last)
                    last = now
                    if stop.is_set():
                        break

    threads = [threading.Thread(target=f, daemon=True) for f in (probes, stream)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=120)


def phase_big(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"fault_count": 0}
    text = "word " * (2 * 1024 * 1024)   # 10 MB
    cases: list[tuple[str, dict[str, Any] | None, int]] = [
        ("nothing (the probes' and the stream's own latency)", None, 0),
        ("10MB prompt", {"model": srv.model, "prompt": text, "max_tokens": 1}, 400),
        ("10MB prompt, truncate_prompt_tokens 64", {"model": srv.model, "prompt": text, "max_tokens": 1,
                                                    "truncate_prompt_tokens": 64}, 200),
        ("40MB body", {"model": srv.model, "prompt": text * 4, "max_tokens": 1}, 413)]
    for name, request, want in cases:
        data = json.dumps(request).encode()   # before the watch: this process's own GIL would stall its probes
        stop, gaps = threading.Event(), {}
        watcher = threading.Thread(target=_watch, args=(srv, stop, gaps))
        watcher.start()
        time.sleep(1.0)   # the stream is running
        t = time.perf_counter()
        try:
            status = 0 if request is None else httpx.post(
                srv.url + "/v1/completions", headers={**auth(), "content-type": "application/json"}, content=data,
                timeout=300).status_code
            if request is None:
                time.sleep(3.0)
        except httpx.HTTPError as e:   # the 413 may close the connection while the client still sends
            status = 413 if "40MB" in name else 0
            out.setdefault("notes", []).append(f"{name}: {type(e).__name__}")
        took = time.perf_counter() - t
        time.sleep(0.5)
        stop.set()
        watcher.join()
        out[name] = {"status": status, "seconds": round(took, 2), **{k: round(v, 3) for k, v in gaps.items()}}
        out["fault_count"] += status != want
    for name, size, want in (("4 x 28MB prompts at once", 28, 400), ("4 x 50MB bodies at once", 50, 413)):
        datas = [json.dumps({"model": srv.model, "prompt": f"w{i} " * (size * 1024 * 1024 // 3),
                             "max_tokens": 1}).encode() for i in range(4)]
        before = srv.rss_mib()
        statuses = _run_many(4, 4, lambda i: _post_status(srv, datas[i]))
        time.sleep(2.0)
        out[name] = {"statuses": dict(statuses), "rss_before_mib": round(before, 1),
                     "rss_after_mib": round(srv.rss_mib(), 1)}
        out["fault_count"] += statuses[str(want)] != 4
    return out


def _post_status(srv: Server, data: bytes) -> str:
    try:
        return str(httpx.post(srv.url + "/v1/completions", content=data, timeout=300,
                              headers={**auth(), "content-type": "application/json"}).status_code)
    except httpx.HTTPError:   # a 413 may close the connection while the client still sends
        return "413" if len(data) > 32 * 1024 * 1024 else "no answer"


def phase_slow(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    statuses: Counter[int] = Counter()
    socks = []
    for _ in range(50):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEYS[0].encode() +
                  b"\r\nContent-Length: 1000\r\n\r\n{\"model\": ")
        socks.append(s)
    t = time.perf_counter()
    for s in socks:
        try:
            answer = s.recv(200)
            statuses[int(answer.split()[1]) if answer.startswith(b"HTTP/") else 0] += 1
        except OSError:
            statuses[0] += 1
        s.close()
    return {"clients": len(socks), "statuses": dict(statuses), "all_answered_s": round(time.perf_counter() - t, 1),
            "fault_count": sum(n for s, n in statuses.items() if s != 408)}


def _idle(srv: Server) -> float:
    """Seconds until no request runs or waits and the KV cache is empty (nan after 60 s)."""
    t = time.perf_counter()
    while time.perf_counter() - t < 60:
        g = srv.gauges()
        if g["num_requests_running"] == 0 and g["num_requests_waiting"] == 0 and g["kv_cache_usage_perc"] == 0:
            return round(time.perf_counter() - t, 2)
        time.sleep(0.05)
    return float("nan")


def _one(srv: Server, rng: random.Random, i: int) -> str:
    """One soak request: 'gone' (its client left at a random moment), else its status, 'lost' without one."""
    stream = rng.random() < 0.5
    request = body({"max_tokens": rng.choice([2, 4, 8, 16]), "stream": stream, "ignore_eos": True}, srv.model)
    if rng.random() < 0.4:
        data = json.dumps(request).encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Authorization: Bearer " + KEYS[0].encode() + b"\r\nContent-Length: " +
                      str(len(data)).encode() + b"\r\n\r\n" + data)
            time.sleep(rng.random() * 0.3)
        return "gone"
    try:
        with httpx.stream("POST", srv.url + "/v1/chat/completions", headers=auth(), json=request, timeout=120) as r:
            text = "".join(r.iter_text())
        if r.status_code == 200 and stream and not text.rstrip().endswith("data: [DONE]"):
            return "lost"
        return str(r.status_code)
    except httpx.HTTPError:
        return "lost"


def _run_many(count: int, workers: int, fn: Callable[[int], str]) -> Counter[str]:
    with ThreadPoolExecutor(workers) as pool:
        return Counter(pool.map(fn, range(count)))


def phase_soak(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    rngs = [random.Random(args.seed * 100_000 + i) for i in range(args.soak)]
    outcomes = _run_many(args.soak, 32, lambda i: _one(srv, rngs[i], i))
    idle = _idle(srv)
    return {"requests": args.soak, "outcomes": dict(outcomes), "lost": outcomes["lost"], "kv_idle_after_s": idle,
            "fault_count": outcomes["lost"] + sum(n for k, n in outcomes.items() if k.startswith("5") and k != "503")
            + (idle != idle)}


def phase_burst(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    def one(i: int) -> str:
        try:
            r = httpx.post(srv.url + "/v1/chat/completions", headers=auth(), timeout=120,
                           json=body({"max_tokens": 4, "ignore_eos": True}, srv.model))
            return f"{r.status_code}" + (" retry-after" if r.headers.get("retry-after") else "")
        except httpx.HTTPError:
            return "lost"
    outcomes = _run_many(200, 200, one)
    return {"requests": 200, "outcomes": dict(outcomes), "kv_idle_after_s": _idle(srv),
            "fault_count": sum(n for k, n in outcomes.items() if k not in ("200", "503 retry-after"))}


def phase_sigterm(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    def one(i: int) -> str:
        stream = i % 2 == 0
        request = body({"max_tokens": 2000 if i % 3 else 2, "stream": stream, "ignore_eos": True}, srv.model)
        try:
            with httpx.stream("POST", srv.url + "/v1/chat/completions", headers=auth(), json=request,
                              timeout=120) as r:
                text = "".join(r.iter_text())
        except httpx.HTTPError:
            return "lost"
        if r.status_code != 200:
            return str(r.status_code)
        if not stream:
            return "200 done"
        return "200 error event" if '"server_shutting_down"' in text else "200 done" if "[DONE]" in text else "lost"

    with ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(one, i) for i in range(24)]
        deadline = time.monotonic() + 60
        while (running := srv.gauges()["num_requests_running"]) < 16 and time.monotonic() < deadline:   # the long
            time.sleep(0.05)
        srv.proc.send_signal(signal.SIGTERM)
        outcomes = Counter(f.result() for f in futures)
    code = srv.proc.wait(timeout=60)
    return {"running_at_sigterm": running, "outcomes": dict(outcomes), "exit_status": code,
            "fault_count": outcomes["lost"] + (code != 0)}


PHASES = {"fuzz": phase_fuzz, "raw": phase_raw, "credentials": phase_credentials, "tenants": phase_tenants,
          "big": phase_big, "slow": phase_slow, "soak": phase_soak, "burst": phase_burst}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a checkpoint folder (default: the demo model)")
    p.add_argument("--serve-args", default="", help="more `openinfer serve` flags, e.g. \"--ep 2\"")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bodies", type=int, default=2600, help="fuzz bodies")
    p.add_argument("--soak", type=int, default=1000, help="soak requests")
    p.add_argument("--log", default="/tmp/soak-server.log", help="the server's log")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--phases", default=",".join(PHASES), help="which phases, in order (sigterm always ends the run)")
    args = p.parse_args()
    srv = Server(args)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results: dict[str, Any] = {"command": " ".join(sys.argv), "commit": commit, "seed": args.seed,
                               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
                               "rss_idle_start_mib": round(srv.rss_mib(), 1)}
    try:
        for name in args.phases.split(","):
            t = time.perf_counter()
            results[name] = PHASES[name](srv, args)
            results[name]["phase_s"] = round(time.perf_counter() - t, 1)
            print(name, json.dumps(results[name]), flush=True)
        time.sleep(2.0)
        results["rss_idle_end_mib"] = round(srv.rss_mib(), 1)
        results["sigterm"] = phase_sigterm(srv, args)
        print("sigterm", json.dumps(results["sigterm"]), flush=True)
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    results["faults"] = sum(r.get("fault_count", 0) for r in results.values() if isinstance(r, dict))
    print("rss idle MiB: start", results["rss_idle_start_mib"], "end", results["rss_idle_end_mib"])
    print("faults:", results["faults"])
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 1 if results["faults"] else 0


if __name__ == "__main__":
    sys.exit(main())
