"""A tiny OpenAI-ish server for the `bench startup` test: `python tiny_server.py PORT`.

It waits a little before listening (a start-up to measure), starts one child process (so the RSS is a
tree), answers GET /v1/models and streams POST /v1/completions, and exits on SIGTERM.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            self.send_error(404)
            return
        body = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(req["max_tokens"]):
            chunk = {"choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}], "usage": None}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": len(req["prompt"]), "completion_tokens": req["max_tokens"]}
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        self.close_connection = True


def main() -> None:
    port = int(sys.argv[1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)

    def stop(*_: object) -> None:
        child.terminate()
        child.wait()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    time.sleep(0.3)
    print(f"tiny server listening on {port}", flush=True)   # output for bench startup --server-log
    server.serve_forever()


if __name__ == "__main__":
    main()
