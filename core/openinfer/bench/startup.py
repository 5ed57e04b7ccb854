"""`openinfer bench startup -- CMD...`: launch a server, time it to the first good GET /v1/models, and read
the RSS of its whole process tree (idle, peak during a load burst, after it) from /proc (Linux, no psutil)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import httpx
import numpy as np

from openinfer.bench.client import COMPLETIONS, make_client, send_request
from openinfer.bench.datasets import BenchRequest


def tree_pids(root: int) -> list[int]:
    """`root` and all its descendants, via /proc/<pid>/task/*/children (children of every thread)."""
    out: list[int] = []
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out.append(pid)
        for path in glob.glob(f"/proc/{pid}/task/*/children"):
            try:
                with open(path) as f:
                    stack.extend(int(x) for x in f.read().split())
            except OSError:
                pass  # the thread or process exited while we looked
    return out


def rss_bytes(pid: int) -> int:
    """VmRSS of one process; 0 for a process that is gone or has no memory (zombie)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


FRAMEWORKS = ("torch", "tensorflow", "onnxruntime", "jaxlib")   # what `serve` must never load


def frameworks_in(maps: str) -> set[str]:
    """The model frameworks with a file of their own package folder (site-packages/<name>/ or
    dist-packages/<name>/) in a /proc/PID/maps text; a name elsewhere in a path (a venv at
    /opt/torch/.venv, say) is not one."""
    return {name for name in FRAMEWORKS if f"-packages/{name}/" in maps}


def frameworks_mapped(pids: list[int]) -> list[str]:
    """The model frameworks whose own files any of `pids` has mapped: proof from outside the process
    that it never imported them, whatever is installed beside it."""
    found: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                found |= frameworks_in(f.read())
        except OSError:
            continue   # gone, or not ours to read
    return sorted(found)


def tree_rss(root: int) -> tuple[int, int]:
    """(total RSS in bytes, number of processes) of the tree under `root`."""
    pids = tree_pids(root)
    return sum(rss_bytes(p) for p in pids), len(pids)


class PeakSampler:
    """Samples the tree's RSS in a thread while a burst runs and keeps the maximum."""

    def __init__(self, root: int, interval: float = 0.05) -> None:
        self.root, self.interval, self.peak = root, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.root)[0])
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss(self.root)[0])


def wait_ready(base_url: str, proc: subprocess.Popen[bytes], t_launch: float, timeout: float) -> tuple[float, str]:
    """Polls GET /v1/models until a 200; returns (seconds since launch, first model id)."""
    url = base_url.rstrip("/") + "/v1/models"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before it was ready")
        try:
            resp = httpx.get(url, timeout=2.0)
            if resp.status_code == 200:
                return time.perf_counter() - t_launch, resp.json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            pass  # not listening yet, or not answering properly yet
        if time.perf_counter() - t_launch > timeout:
            raise RuntimeError(f"server not ready after {timeout:g}s")
        time.sleep(0.05)


async def burst(base_url: str, model: str, n: int, input_len: int, output_len: int, vocab: int) -> int:
    """n concurrent streaming completions; returns how many failed."""
    rng = np.random.default_rng(0)
    reqs = [BenchRequest(rng.integers(0, vocab, input_len).tolist(), input_len, output_len) for _ in range(n)]
    sampling = {"temperature": 0.0, "ignore_eos": True}
    async with make_client(base_url, n) as client:
        outs = await asyncio.gather(*(send_request(client, COMPLETIONS, model, r, sampling) for r in reqs))
    return sum(not o.success for o in outs)


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat, which tells a process from a later one that reused its pid;
    None once the process is gone or a zombie (it holds no memory and cannot be signalled)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def terminate_tree(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the whole tree (listed first: children are re-parented once the root dies), then SIGKILL
    those same processes that still run after `grace` seconds."""
    tree = {pid: _start_time(pid) for pid in tree_pids(proc.pid)}
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()  # reaps the root once it exits
        if not any(t is not None and _start_time(p) == t for p, t in tree.items()):
            break
        time.sleep(0.05)
    for pid, started in tree.items():
        if started is not None and _start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    proc.wait()


def _mb(n: int) -> float:
    return round(n / 2**20, 1)


def run_startup(args: argparse.Namespace, cmd: list[str]) -> int:
    log = tempfile.TemporaryFile()
    t_launch = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    res: dict[str, Any] = {"command": cmd, "pid": proc.pid}
    try:
        res["ready_s"], model = wait_ready(args.base_url, proc, t_launch, args.timeout)
        time.sleep(args.idle_wait)
        idle, res["idle_processes"] = tree_rss(proc.pid)
        res["idle_rss_mb"] = _mb(idle)
        res["pids"] = tree_pids(proc.pid)
        res["frameworks_loaded"] = frameworks_mapped(res["pids"])
        if args.burst > 0:
            with PeakSampler(proc.pid) as sampler:
                res["burst_failed"] = asyncio.run(burst(args.base_url, model, args.burst, args.burst_input_len,
                                                        args.burst_output_len, args.vocab_size))
            res.update(burst_requests=args.burst, burst_peak_rss_mb=_mb(sampler.peak),
                       after_burst_rss_mb=_mb(tree_rss(proc.pid)[0]))
    except RuntimeError as e:
        log.seek(0)
        tail = log.read()[-3000:].decode(errors="replace")
        print(f"error: {e}\n--- server output (tail) ---\n{tail}", file=sys.stderr)
        return 1
    finally:
        terminate_tree(proc)
        res["exit_code"] = proc.returncode
        if args.server_log:
            log.seek(0)
            args.server_log.write_bytes(log.read())
        log.close()
    print(f"ready in {res['ready_s']:.2f} s; idle RSS {res['idle_rss_mb']} MB over {res['idle_processes']} process(es); "
          f"model frameworks mapped: {', '.join(res['frameworks_loaded']) or 'none'}")
    if args.burst > 0:
        print(f"burst of {args.burst}: {res['burst_failed']} failed; peak RSS {res['burst_peak_rss_mb']} MB, "
              f"after {res['after_burst_rss_mb']} MB")
    if args.output_json:
        args.output_json.write_text(json.dumps(res, indent=2))
    return 0
