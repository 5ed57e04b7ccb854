"""What `openinfer serve`'s start-up time and resident memory are made of, phase by phase (Linux /proc).

    python scripts/rss_breakdown.py MODEL_DIR [--device cuda] [--max-model-len N] [--maps 15]
Runs serve's own start-up in this process (the early CUDA context, the imports, the engine load with
its phase log, the HTTP app) and prints every phase (openinfer.loading.phases) in the order they ended: seconds
after process start, its duration, the thread it ran on, and RSS after it (anonymous / file-backed /
shared memory). Then idle RSS after a GC and a heap trim, and the largest mappings by RSS
(/proc/self/smaps: which libraries and heaps the file-backed and anonymous parts are).
"""
from __future__ import annotations

import argparse
import gc
import sys
from collections import defaultdict

from openinfer.loading.cuda_context import create_context_early
from openinfer.loading.phases import PHASES, phase, release_free_heap, rss


def largest_mappings(n: int) -> list[tuple[int, int, str]]:
    """(RSS KiB, anonymous KiB, name) of the n largest mappings by RSS, same-named ones summed."""
    total: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    name = ""
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):    # a mapping's header line
                name = parts[5] if len(parts) > 5 else "[anon]"
            elif parts[0] in ("Rss:", "Anonymous:"):
                total[name][parts[0] == "Anonymous:"] += int(parts[1])
    return sorted(((r, a, k) for k, (r, a) in total.items()), reverse=True)[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--maps", type=int, default=15, help="print this many largest mappings (0: none)")
    a = ap.parse_args()
    create_context_early(a.device)   # as `openinfer serve` does
    with phase("imports (engine, HTTP server)"):
        from openinfer.engine.engine import EngineArgs, build_engine
        from openinfer.server import ModelHost, create_app
    eng = build_engine(a.model, EngineArgs(device=a.device, max_model_len=a.max_model_len))
    with phase("HTTP app"):
        create_app(ModelHost([eng]))
    print(f"\n{'phase':<44} {'ends s':>6} {'took s':>6} {'RSS MB':>7} {'anon':>6} {'file':>6} {'shmem':>6}  thread")
    for p in sorted(PHASES, key=lambda p: p.end):
        r = p.rss
        print(f"{p.name[:44]:<44} {p.end:6.2f} {p.seconds:6.2f} {r.total:7d} {r.anon:6d} {r.file:6d} {r.shmem:6d}"
              f"  {p.thread}")
    gc.collect()
    trimmed = release_free_heap()
    r = rss()
    print(f"{'idle (after gc + heap trim: -' + str(trimmed) + ' MB)':<58} {r.total:7d} {r.anon:6d} {r.file:6d} "
          f"{r.shmem:6d}")
    if a.maps:
        print(f"\nlargest mappings: {'RSS MB':>7} {'anon':>6}  name")
        for kib, anon, name in largest_mappings(a.maps):
            print(f"{'':18}{kib / 1024:7.1f} {anon / 1024:6.1f}  {name}")
    print("torch imported:", "torch" in sys.modules)


if __name__ == "__main__":
    main()
