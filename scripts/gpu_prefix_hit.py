"""In-process TTFT of a warm full-prompt prefix hit against a cold prefill (Qwen3-4B shape, dummy weights).

No HTTP: the engine is stepped in this thread, TTFT is submit -> first token. Rows per length:
  cold        a fresh prompt (full prefill)
  hit         the same prompt again: the last token's block copied on write, one-token step (graph replay)
  hit-eager   the same, with the decode graphs switched off for the step (eager forward)
  hit-block   the pre-copy-on-write rule: the last block (16 tokens) recomputed in an eager prefill step
--gc-freeze: move the loaded engine's objects out of the collector's sight first (gc.freeze).
--profile N: then cProfile of N eager forwards of a one-token and a 16-token step (where the Python goes).
    python scripts/gpu_prefix_hit.py [--lengths 1024,16384] [--repeats 10] [--profile 20] [--max-num-batched-tokens N]
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from openinfer.engine.engine import Engine, EngineArgs, build_engine
from openinfer.contract.plugins import get_plugins
from openinfer.engine.request import Finished, Request, RequestStream, Tokens
from openinfer.engine.scheduler import ScheduledRun, StepPlan
from openinfer.testing.engine import greedy


def config_dir(preset: str, tokenizer: str | None = None) -> Path:
    """A checkpoint folder without weights (config + tokenizer), for --load-format dummy; `tokenizer`: a folder
    whose tokenizer files stand in for a line that ships none (the token ids are random either way)."""
    line = next(l for l in get_plugins().lines.values() if preset in l.presets)
    out = Path(tempfile.mkdtemp(prefix=f"{preset}-"))
    (out / "config.json").write_text(json.dumps(line.presets[preset]))
    for f in Path(tokenizer or line.tokenizer_dir()).iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    return out


class GcPauses:
    """Garbage-collector pauses (generation, ms), recorded through gc.callbacks."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((info["generation"], 1e3 * (time.perf_counter() - self._t0)))

    def take(self) -> list[tuple[int, float]]:
        out, self.pauses = self.pauses, []
        return out


def ttft(eng: Engine, ids: list[int]) -> tuple[float, int]:
    """Seconds from submit to the first token (stepping the engine here), and the cached tokens."""
    t0 = time.perf_counter()
    stream = eng.submit(ids, greedy(2))
    first, events = None, []
    while eng.has_unfinished():
        eng.step()
        events += drain(stream)
        if first is None and any(isinstance(ev, Tokens) for ev in events):
            first = time.perf_counter() - t0
    events += drain(stream)
    assert isinstance(events[-1], Finished), events[-1]
    return first, events[-1].cached_tokens


def drain(stream: RequestStream) -> list:
    """The events already there, without blocking."""
    out = []
    while True:
        try:
            out.append(stream.get(timeout=0))
        except TimeoutError:
            return out


@contextmanager
def variant(eng: Engine, name: str) -> Iterator[None]:
    saved_graphs, bm = eng.runner.graphs, eng.blocks
    if name == "hit-eager":
        eng.runner.graphs = None
    if name == "hit-block":   # no copy-on-write source: the last token's block is recomputed
        match = bm._match
        bm._match = lambda req: (match(req)[0], None)
    try:
        yield
    finally:
        eng.runner.graphs = saved_graphs
        bm.__dict__.pop("_match", None)


def profile_eager(eng: Engine, context: int, n: int) -> None:
    """cProfile of n eager forwards of a one-token and a 16-token run over `context` tokens of KV."""
    runner = eng.runner
    req = Request("profile", list(range(context)), greedy(1), RequestStream("profile"), 0.0)
    assert eng.blocks.try_admit(req)
    runner.pools.copy_blocks(eng.blocks.take_block_copies())
    eng.blocks.allocate(req, context)
    try:
        for length in (1, 16):
            batch = runner.prepare(StepPlan([ScheduledRun(req, context - length, length, True)]))
            runner._forward(batch)
            runner.backend.synchronize()
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            for _ in range(n):
                runner._forward(batch)
            prof.disable()
            host = (time.perf_counter() - t0) / n
            runner.backend.synchronize()
            print(f"\n== eager forward, {length} token(s) over {context}: {1e3 * host:.2f} ms of host time each "
                  "(under cProfile)")
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    finally:
        eng.blocks.release(req)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1024,16384")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--preset", default="qwen3-4b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() the loaded engine's objects first")
    ap.add_argument("--prefix-cache-hash", default="builtin", choices=("builtin", "sha256"))
    ap.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: the engine's for the device")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder for a line that ships none")
    a = ap.parse_args()
    lengths = [int(n) for n in a.lengths.split(",")]
    eng = build_engine(str(config_dir(a.preset, a.tokenizer)), EngineArgs(device=a.device, load_format="dummy", max_num_seqs=8,
                                                             max_model_len=max(lengths) + 64,
                                                             prefix_cache_hash=a.prefix_cache_hash,
                                                             max_num_batched_tokens=a.max_num_batched_tokens))
    print(f"step token budget {eng.args.max_num_batched_tokens}, prefix-cache keys {a.prefix_cache_hash}")
    rng = np.random.default_rng(0)
    vocab = min(150000, eng.vocab_size)
    for _ in range(2):   # warm-up: every variant's kernels loaded
        ids = rng.integers(0, vocab, 64).tolist()
        for name in ("cold", "hit", "hit-eager", "hit-block"):
            with variant(eng, name):
                ttft(eng, ids)
    print(f"{'tokens':>7} {'row':<10} {'n':>3} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'cached':>7}")
    if a.gc_freeze:
        gc.collect()
        gc.freeze()
    gcp = GcPauses()
    for n in lengths:
        rows: dict[str, list[tuple[float, int]]] = {}
        hit_pauses = []
        for _ in range(a.repeats):
            ids = rng.integers(0, vocab, n).tolist()
            rows.setdefault("cold", []).append(ttft(eng, ids))
            for name in ("hit", "hit-eager", "hit-block"):
                gcp.take()
                with variant(eng, name):
                    rows.setdefault(name, []).append(ttft(eng, ids))
                if name == "hit":
                    hit_pauses += gcp.take()
        for name, got in rows.items():
            ms = np.array([t for t, _ in got]) * 1e3
            print(f"{n:>7} {name:<10} {len(ms):>3} {np.percentile(ms, 50):>8.2f} {np.percentile(ms, 99):>8.2f} "
                  f"{ms.mean():>8.2f} {int(np.median([c for _, c in got])):>7}")
        worst = max(hit_pauses, key=lambda p: p[1], default=(None, 0.0))
        print(f"{n:>7} gc pauses during the hit samples: {len(hit_pauses)}, worst {worst[1]:.2f} ms (gen {worst[0]})")
    if a.profile:
        profile_eager(eng, lengths[0], a.profile)


if __name__ == "__main__":
    main()
