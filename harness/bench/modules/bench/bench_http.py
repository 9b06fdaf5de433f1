"""The one HTTP handler every request-path figure serves, and the loopback baseline servers.

``GenerateHandler`` answers ``POST /v1/generate`` with ``{"prompt": str}`` the way the
reference model service does (a tiny deterministic "model"). The bench service serves it
through the agent (``serve_http``); the baselines serve the very same class on a
``ThreadingHTTPServer`` over loopback TCP (with and without ``TCP_NODELAY``) and over a unix
socket path.

Run as ``python -I bench_http.py baseline <unix path>``: starts the three baseline servers in
this process, prints one JSON line ``{"tcp_nodelay": port, "tcp_naive": port, "unix": path}``
and serves until stdin closes.

Standard library only (it is also loaded by the bench service, which runs ``python -I``).
"""

from __future__ import annotations

import hashlib
import json
import os
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["GenerateHandler", "NoDelayHandler", "complete", "start_baselines"]

MAX_BODY = 1 << 20


def complete(prompt: str) -> str:
    """The stand-in model (as examples/modelserver): the prompt reversed, plus a tag."""
    tag = hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:8]
    return f"{prompt[::-1]} [{tag}]"


class GenerateHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; the body is read by Content-Length."""

    protocol_version = "HTTP/1.1"
    server_version = "oarbank-bench/0.1"

    def _send_json(self, status: int, obj: dict) -> None:
        body = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 (stdlib name)
        length_text = self.headers.get("Content-Length", "0")
        if not length_text.isdigit() or int(length_text) > MAX_BODY:
            self.close_connection = True
            self._send_json(400, {"error": f"bad Content-Length {length_text!r}"})
            return
        raw = self.rfile.read(int(length_text))
        if self.path != "/v1/generate":
            self._send_json(404, {"error": f"no such path {self.path!r}"})
            return
        try:
            prompt = json.loads(raw.decode("utf-8"))["prompt"]
            if not isinstance(prompt, str):
                raise TypeError("prompt is not a string")
        except (ValueError, KeyError, TypeError) as exc:
            self._send_json(400, {"error": f"body must be {{\"prompt\": str}} ({exc})"})
            return
        self._send_json(200, {"text": complete(prompt), "pid": os.getpid()})

    def address_string(self) -> str:
        return "peer"  # a unix or brokered peer has no (host, port)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib name)
        pass  # a log line per request would be part of what is measured


class NoDelayHandler(GenerateHandler):
    """The tuned server: TCP_NODELAY on every accepted connection (StreamRequestHandler)."""

    disable_nagle_algorithm = True


class _TunedHTTPServer(ThreadingHTTPServer):
    # socketserver's listen backlog is 5: a burst of connects overflows it and the kernel
    # drops SYNs (a 1 s retransmit each). A tuned server listens with a real backlog.
    request_queue_size = 1024


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 1024


def start_baselines(unix_path: str) -> tuple[dict, list]:
    """Start the three baseline servers on daemon threads; (addresses, servers)."""
    nodelay = _TunedHTTPServer(("127.0.0.1", 0), NoDelayHandler)
    naive = _TunedHTTPServer(("127.0.0.1", 0), GenerateHandler)
    unix = _UnixHTTPServer(unix_path, GenerateHandler)
    servers = [nodelay, naive, unix]
    for s in servers:
        s.daemon_threads = True
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 3600},
                         daemon=True).start()
    addrs = {"tcp_nodelay": nodelay.server_address[1], "tcp_naive": naive.server_address[1],
             "unix": unix_path}
    return addrs, servers


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "baseline":
        print("usage: bench_http.py baseline <unix socket path>", file=sys.stderr)
        return 2
    addrs, servers = start_baselines(argv[1])
    print(json.dumps(addrs), flush=True)
    sys.stdin.read()  # the harness closes our stdin to stop us
    for s in servers:
        s.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
