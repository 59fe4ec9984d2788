"""A scripted HTTP server with SGLang's endpoints and answers: a test double for
the readiness gate's HTTP cases that the SGLang simulator does not produce on
its own (a 500 from /generate, an empty generation, a hanging request, a 403
from a gateway, a server that exits a moment after answering).

Run as a process: ``python fake_sglang_http.py PORT SCENARIO_JSON``. Every request
is logged to stdout as uvicorn does, so tests can count them.

Scenario keys: bind_after, ready_after (s after bind until /health is 200),
models (ids), api_key, status_for_auth (401 or 403), generation ("ok", "empty",
"zero_tokens", "error", "hang", "die"), exit_after (s after bind, exit code 3),
ready_endpoint (serve /ready as 0.5.20+ does: 503 until ready_after, then 200;
without it /ready is 404 as before 0.5.20), server_info (the /server_info body),
start_on (a glob: the scenario's clock starts only once a file matches it, e.g.
the gate's progress file, so that the start-up a test scripts begins when the
gate does, however long the gate's own launch took on a loaded machine).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    port, scenario = int(sys.argv[1]), json.loads(sys.argv[2])
    while scenario.get("start_on") and not glob.glob(scenario["start_on"]):
        time.sleep(0.05)
    time.sleep(scenario.get("bind_after", 0))
    bound = time.monotonic()

    def log(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server API
            log(f'INFO:     127.0.0.1:0 - "{self.requestline}" {args[1] if len(args) > 1 else ""}')

        def send(self, status: int, body: object = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def denied(self) -> bool:
            key = scenario.get("api_key")
            if key and self.path != "/health" and self.headers.get("Authorization") != f"Bearer {key}":
                self.send(scenario.get("status_for_auth", 401), {"error": "Unauthorized"})
                return True
            return False

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            if self.denied():
                return
            if self.path == "/v1/models":
                self.send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in scenario.get("models", ["fake-model"])]})
            elif self.path == "/health" or (self.path == "/ready" and scenario.get("ready_endpoint")):
                self.send(200 if time.monotonic() - bound >= scenario.get("ready_after", 0) else 503)
            elif self.path == "/server_info" and "server_info" in scenario:
                self.send(200, scenario["server_info"])
            else:
                self.send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802 - http.server API
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.denied():
                return
            mode = scenario.get("generation", "ok")
            if mode == "hang":
                time.sleep(3600)
            if mode == "die":
                log("Fatal Python error: Segmentation fault")
                os._exit(139)
            if mode == "error":
                self.send(500, {"object": "error", "message": "Internal server error", "code": 500})
                return
            text = "" if mode == "empty" else " Paris. It is the capital"
            tokens = 0 if mode in ("empty", "zero_tokens") else 6
            if self.path == "/generate":
                self.send(200, {"text": text, "meta_info": {"completion_tokens": tokens, "spec_accept_length": 3.2}})
            elif self.path == "/v1/completions":
                self.send(200, {"choices": [{"text": text}], "usage": {"completion_tokens": tokens}, "model": body.get("model")})
            elif self.path == "/v1/chat/completions":
                message = {"role": "assistant", "content": None, "reasoning_content": text}
                self.send(200, {"choices": [{"message": message}], "usage": {"completion_tokens": tokens}, "model": body.get("model")})
            else:
                self.send(404, {"detail": "Not Found"})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    log(f"INFO:     Uvicorn running on http://127.0.0.1:{port} (Press CTRL+C to quit)")
    if "exit_after" in scenario:
        threading.Timer(scenario["exit_after"], lambda: os._exit(3)).start()
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
