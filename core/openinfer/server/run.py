"""serve(): run the OpenAI-compatible server in this process until interrupted, or until an engine dies.

A dead engine ends the process with exit status 1: its requests already fail and /health
says 503, but a server that stays up with a dead engine is one no supervisor restarts.
"""
from __future__ import annotations

import gc
import logging
import threading
from typing import Sequence

import uvicorn

from .app import create_app
from .host import ModelHost
from .stats_log import StatsLogger

log = logging.getLogger("openinfer.server")
ENGINE_DIED = 1   # serve()'s exit status when an engine died


def serve(host: ModelHost, address: str, port: int, log_level: str = "info", api_keys: Sequence[str] = (),
          shutdown_timeout: float = 5.0, allowed_origins: Sequence[str] = ("*",), log_stats: bool = True) -> int:
    """Start the host's engines, serve HTTP on address:port until SIGINT/SIGTERM (exit status 0) or until an
    engine dies (ENGINE_DIED), then shut the engines down. Either way the server stops accepting connections and
    in-flight requests get shutdown_timeout seconds to finish; the rest are aborted with their engine."""
    # What loading built (weights' wrappers, tokenizer, kernels, graphs) lives as long as the
    # process; a full collection walking it took ~20 ms on the H200 host (12 ms for the demo
    # model here), landing on some request's time to first token. Frozen objects are left out
    # of every collection (reference counting still frees them).
    gc.collect()
    gc.freeze()
    host.start()
    stats = StatsLogger(host).start() if log_stats else None
    stop, died = threading.Event(), []
    try:
        app = create_app(host, api_keys, allowed_origins)
        config = uvicorn.Config(app, host=address, port=port, log_level=log_level, lifespan="off",
                                timeout_graceful_shutdown=shutdown_timeout)
        server = uvicorn.Server(config)
        watch = threading.Thread(target=_watch, args=(host, server, stop, died), name="engine-watch", daemon=True)
        watch.start()
        server.run()
    finally:
        stop.set()
        if stats is not None:
            stats.stop()
        host.shutdown()
    return ENGINE_DIED if died else 0


def _watch(host: ModelHost, server: uvicorn.Server, stop: threading.Event, died: list[str],
           every: float = 0.5) -> None:
    while not stop.wait(every):
        dead = [f"'{m.name}': {m.engine.dead_reason}" for m in host if not m.engine.is_alive()]
        if dead:
            log.error("engine died (%s); shutting the server down with exit status %d", "; ".join(dead),
                      ENGINE_DIED)
            died.extend(dead)
            server.should_exit = True
            return
