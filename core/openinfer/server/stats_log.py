"""The periodic stats line (vLLM's "Avg prompt throughput ..."): what operators watch in the log.

Every `interval` seconds in which an engine did anything, one line per engine: prompt and generation
throughput over the interval, running and waiting requests, KV-cache usage and the interval's prefix-cache
hit rate. A daemon thread reads engine.stats(), which the /metrics route reads too; `--disable-log-stats`
turns it off.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from .host import Engine, ModelHost

log = logging.getLogger("openinfer.stats")


@dataclass
class _Seen:
    at: float
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0


class StatsLogger:
    def __init__(self, host: ModelHost, interval: float = 10.0) -> None:
        now = time.monotonic()
        # one line per engine, named by its first served name
        self._engines: dict[str, Engine] = {}
        for m in host:
            if all(e is not m.engine for e in self._engines.values()):
                self._engines[m.name] = m.engine
        self._seen = {name: _Seen(now) for name in self._engines}
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def lines(self, now: float | None = None) -> list[str]:
        """The lines due now (engines idle since the last call have none); moves the interval on."""
        now = time.monotonic() if now is None else now
        out = []
        for name, engine in self._engines.items():
            s, seen = engine.stats(), self._seen[name]
            dt = max(now - seen.at, 1e-9)
            prompt, gen = s.prompt_tokens - seen.prompt_tokens, s.generation_tokens - seen.generation_tokens
            queries, hits = s.prefix_queries - seen.prefix_queries, s.prefix_hits - seen.prefix_hits
            self._seen[name] = _Seen(now, s.prompt_tokens, s.generation_tokens, s.prefix_queries, s.prefix_hits)
            if not (prompt or gen or s.num_running or s.num_waiting):
                continue
            cache = f"prefix-cache hits {100 * hits / queries:.1f} % of {queries} prompt tokens" if queries else \
                "no prefix-cache lookups"
            out.append(f"{name}: prompt {prompt / dt:.1f} tokens/s, generation {gen / dt:.1f} tokens/s, "
                       f"running {s.num_running}, waiting {s.num_waiting}, KV cache {100 * s.kv_usage:.1f} %, {cache}")
        return out

    def start(self) -> StatsLogger:
        self._thread = threading.Thread(target=self._run, name="stats-log", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                for line in self.lines():
                    log.info(line)
            except Exception:   # a dead engine's stats must not end the server's log
                log.exception("stats line failed")
