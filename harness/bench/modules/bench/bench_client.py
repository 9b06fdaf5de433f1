"""The measuring client: the same loops inside an attempt (brokered) and in a baseline process.

Every figure of the request path is measured here, so the brokered runner and the loopback
baseline process run the very same code; only the way a connection is made differs:

- brokered: ``service_endpoint.request`` (a connection per request) and
  ``service_endpoint.HTTPConnection`` (keep-alive), through the attempt's connector;
- loopback: ``http.client`` to a ``ThreadingHTTPServer`` over TCP (``TCP_NODELAY`` on, or
  off for the naive figure) or over a unix socket path.

Run as ``python -I bench_client.py '<json args>'`` for the baselines: prints one JSON object.
``{"mode": "requests", "tcp_nodelay": port, "tcp_naive": port, "unix": path, "per_request": n,
"keepalive": n, "warmup": n}`` or ``{"mode": "connect", "port": p, "count": n, "ready_dir": d,
"go_file": f}`` (``"mode": "pairs"``, without ``port``: the kernel's part of a hand-over,
``kernel_pairs``).

Standard library only.
"""

from __future__ import annotations

import array
import http.client
import json
import os
import socket
import sys
import time
from collections.abc import Callable

__all__ = ["BODY", "PATH", "per_request_loop", "keepalive_loop", "connect_loop", "barrier",
           "loopback_requests", "loopback_connects"]

PATH = "/v1/generate"
BODY = {"prompt": "The quick brown fox jumps over the lazy dog"}
HEADERS = {"Content-Type": "application/json"}


# --- connections ------------------------------------------------------------------------------


class TCPConnection(http.client.HTTPConnection):
    """http.client over loopback TCP; ``nodelay`` False clears TCP_NODELAY (http.client sets
    it by default) so that both ends run with Nagle, as a naive setup does."""

    def __init__(self, port: int, nodelay: bool) -> None:
        super().__init__("127.0.0.1", port, timeout=30)
        self.nodelay = nodelay

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if self.nodelay else 0)


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


def _one_request(conn: http.client.HTTPConnection, close: bool) -> bytes:
    data = json.dumps(BODY).encode("utf-8")
    headers = dict(HEADERS)
    if close:
        headers["Connection"] = "close"
    conn.request("POST", PATH, body=data, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"POST {PATH} answered {resp.status}: {body[:200]!r}")
    return body


# --- loops (what is timed) --------------------------------------------------------------------


def per_request_loop(do_request: Callable[[], object], n: int, warmup: int) -> tuple[list, float]:
    """(latencies in s, wall s) of ``n`` requests each on a fresh connection."""
    for _ in range(warmup):
        do_request()
    lat = []
    t_all = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        do_request()
        lat.append(time.perf_counter() - t0)
    return lat, time.perf_counter() - t_all


def keepalive_loop(conn: http.client.HTTPConnection, n: int, warmup: int) -> tuple[list, float]:
    """(latencies in s, wall s) of ``n`` requests over the one connection ``conn``."""
    try:
        for _ in range(warmup):
            _one_request(conn, close=False)
        lat = []
        t_all = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            _one_request(conn, close=False)
            lat.append(time.perf_counter() - t0)
        return lat, time.perf_counter() - t_all
    finally:
        conn.close()


def connect_loop(connect: Callable[[], socket.socket], n: int) -> tuple[list, float, float]:
    """(latencies, first start, last end) of ``n`` connects; each stream is closed at once.
    Times are ``time.time()`` so that several processes can be put on one clock."""
    lat = []
    first = time.time()
    for _ in range(n):
        t0 = time.perf_counter()
        s = connect()
        lat.append(time.perf_counter() - t0)
        s.close()
    return lat, first, time.time()


def barrier(ready_dir: str, name: str, go_file: str, timeout: float = 60.0) -> None:
    """Say we are ready (a file in ``ready_dir``), then wait for ``go_file`` to exist."""
    with open(os.path.join(ready_dir, name), "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + timeout
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {go_file} within {timeout:g}s")
        time.sleep(0.002)


# --- the loopback baselines -------------------------------------------------------------------


def loopback_requests(args: dict) -> dict:
    n, k, w = args["per_request"], args["keepalive"], args.get("warmup", 2)
    out: dict = {}

    def per_request(factory: Callable[[], http.client.HTTPConnection]) -> Callable[[], bytes]:
        def go() -> bytes:
            conn = factory()
            try:
                return _one_request(conn, close=True)
            finally:
                conn.close()
        return go

    tcp = args["tcp_nodelay"]
    out["tcp_per_request"] = per_request_loop(per_request(lambda: TCPConnection(tcp, True)), n, w)
    out["tcp_keepalive"] = keepalive_loop(TCPConnection(tcp, True), k, w)
    # Nagle and delayed ACKs cost ~40 ms a request: fewer requests say as much.
    naive_n = max(5, min(k, args.get("naive_keepalive", k)))
    out["tcp_naive_keepalive"] = keepalive_loop(TCPConnection(args["tcp_naive"], False), naive_n, 1)
    out["unix_per_request"] = per_request_loop(per_request(lambda: UnixConnection(args["unix"])),
                                               n, w)
    out["unix_keepalive"] = keepalive_loop(UnixConnection(args["unix"]), k, w)
    return {key: {"latencies_s": lat, "wall_s": wall} for key, (lat, wall) in out.items()}


def loopback_connects(args: dict) -> dict:
    port = args["port"]

    def connect() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    barrier(args["ready_dir"], f"loopback-{os.getpid()}", args["go_file"])
    lat, first, last = connect_loop(connect, args["count"])
    return {"latencies_s": lat, "first": first, "last": last}


def kernel_pairs(args: dict) -> dict:
    """The kernel's part of one hand-over, nothing else: a socketpair, one end sent over a unix
    stream with SCM_RIGHTS and received, every descriptor closed (issue 29's floor)."""
    here, there = socket.socketpair()

    def connect() -> socket.socket:
        a, b = socket.socketpair()
        here.sendmsg([b"c"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [b.fileno()]))])
        _, anc, _, _ = there.recvmsg(1, socket.CMSG_SPACE(4))
        fds = array.array("i")
        fds.frombytes(anc[0][2])
        b.close()
        os.close(fds[0])
        return a

    barrier(args["ready_dir"], f"pairs-{os.getpid()}", args["go_file"])
    lat, first, last = connect_loop(connect, args["count"])
    return {"latencies_s": lat, "first": first, "last": last}


def main(argv: list[str]) -> int:
    args = json.loads(argv[0])
    if args["mode"] == "requests":
        result = loopback_requests(args)
    elif args["mode"] == "connect":
        result = loopback_connects(args)
    elif args["mode"] == "pairs":
        result = kernel_pairs(args)
    else:
        print(f"bench_client.py: unknown mode {args['mode']!r}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
