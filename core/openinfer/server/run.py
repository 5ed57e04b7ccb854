"""serve(): run the OpenAI-compatible server in this process until interrupted."""
from __future__ import annotations

import gc
from typing import Sequence

import uvicorn

from .app import create_app
from .host import ModelHost
from .stats_log import StatsLogger


def serve(host: ModelHost, address: str, port: int, log_level: str = "info", api_keys: Sequence[str] = (),
          shutdown_timeout: float = 5.0, allowed_origins: Sequence[str] = ("*",), log_stats: bool = True) -> None:
    """Start the host's engines, serve HTTP on address:port until SIGINT/SIGTERM, then shut the
    engines down. On the signal the server stops accepting connections and in-flight requests get
    shutdown_timeout seconds to finish; the rest are aborted with their engine."""
    # What loading built (weights' wrappers, tokenizer, kernels, graphs) lives as long as the
    # process; a full collection walking it took ~20 ms on the H200 host (12 ms for the demo
    # model here), landing on some request's time to first token. Frozen objects are left out
    # of every collection (reference counting still frees them).
    gc.collect()
    gc.freeze()
    host.start()
    stats = StatsLogger(host).start() if log_stats else None
    try:
        app = create_app(host, api_keys, allowed_origins)
        config = uvicorn.Config(app, host=address, port=port, log_level=log_level, lifespan="off",
                                timeout_graceful_shutdown=shutdown_timeout)
        uvicorn.Server(config).run()
    finally:
        if stats is not None:
            stats.stop()
        host.shutdown()
