"""serve(): run the OpenAI-compatible server in this process until interrupted, or until an engine dies.

A dead engine ends the process with exit status 1: its requests already fail and /health
says 503, but a server that stays up with a dead engine is one no supervisor restarts.
SIGTERM / SIGINT: the server stops accepting connections and in-flight requests get the grace period; those still
running at its end are ended with a 503 (an error event in a stream), the engines shut down and serve() returns 0.
uvicorn itself would re-raise the signal once it stopped, ending the process with 143 before the engines' shutdown.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import threading
from typing import Iterator, Sequence

import uvicorn

from .app import create_app
from .errors import APIError
from .host import ModelHost
from .limits import ServerLimits
from .stats_log import StatsLogger

log = logging.getLogger("openinfer.server")
ENGINE_DIED = 1   # serve()'s exit status when an engine died
# after the grace period, the time the interrupted requests get to send their errors before uvicorn cancels them
LAST_WORDS_S = 2.0
# How long an idle keep-alive connection stays open: above the idle expiry of clients' connection pools (httpx, the
# OpenAI SDK's transport: 5 s; aiohttp: 15 s), so that a client never sends a request on a connection the server is
# closing at that moment (it would see the connection reset). uvicorn's default is httpx's 5 s.
KEEP_ALIVE_S = 75.0


def shutting_down() -> APIError:
    return APIError(503, "The server is shutting down and could not finish this request in its grace period. Retry "
                         "it (on another replica).", code="server_shutting_down", headers={"Retry-After": "1"})


class DrainingServer(uvicorn.Server):
    """uvicorn's server: on shutdown, the host's requests still in flight after `grace` seconds are interrupted;
    the signals it catches are not raised again once it stopped."""

    def __init__(self, config: uvicorn.Config, host: ModelHost, grace: float) -> None:
        super().__init__(config)
        self.host, self.grace = host, grace

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().call_later(self.grace, self.host.interrupt, shutting_down())
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():   # signals reach the main thread only
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def uvicorn_config(app: object, **options: object) -> uvicorn.Config:
    """uvicorn's settings for the app (no lifespan events: serve() starts and stops the engines; KEEP_ALIVE_S)."""
    return uvicorn.Config(app, lifespan="off", timeout_keep_alive=KEEP_ALIVE_S, **options)


def serve(host: ModelHost, address: str, port: int, log_level: str = "info", api_keys: Sequence[str] = (),
          shutdown_timeout: float = 5.0, allowed_origins: Sequence[str] = ("*",), log_stats: bool = True,
          limits: ServerLimits = ServerLimits()) -> int:
    """Start the host's engines, serve HTTP on address:port until SIGINT/SIGTERM (exit status 0) or until an
    engine dies (ENGINE_DIED), then shut the engines down. Either way the server stops accepting connections and
    in-flight requests get shutdown_timeout seconds to finish; the rest are ended with a 503 or an error event."""
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
        app = create_app(host, api_keys, allowed_origins, limits)
        config = uvicorn_config(app, host=address, port=port, log_level=log_level,
                                timeout_graceful_shutdown=shutdown_timeout + LAST_WORDS_S)
        server = DrainingServer(config, host, shutdown_timeout)
        watch = threading.Thread(target=_watch, args=(host, server, stop, died), name="engine-watch", daemon=True)
        watch.start()
        server.run()
    finally:
        stop.set()
        if stats is not None:
            stats.stop()
        host.shutdown()
        log.info("engines shut down")
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
