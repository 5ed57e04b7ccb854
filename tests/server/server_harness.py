"""Test harness: a real uvicorn server on 127.0.0.1 in a background thread, raw-socket requests, polling."""
from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Sequence

import uvicorn

from openinfer.server import ModelHost, create_app
from openinfer.server.limits import ServerLimits
from openinfer.server.run import uvicorn_config


class LiveServer:
    """`with LiveServer(host) as url:` serves the host until the block ends."""

    def __init__(self, host: ModelHost, api_keys: Sequence[str] = (), allowed_origins: Sequence[str] = ("*",),
                 limits: ServerLimits = ServerLimits()) -> None:
        # IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only when the listening socket
        # says TCP; with proto 0, Nagle + delayed ACK add ~40 ms to every keep-alive response.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        app = create_app(host, api_keys, allowed_origins, limits)
        self._server = uvicorn.Server(uvicorn_config(app, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc: Any) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


def post(url: str, path: str, body: dict) -> socket.socket:
    """Send a request on a raw socket and leave the response unread (to disconnect at will)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def wait_until(cond: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()
