"""Real child processes for the broker tests: a job and an endpoint service speaking the wire.

Written with ``oarbank_sdk.protocol``'s wire and transport directly (the SDK's
service_endpoint is another engineer's part). Usage:

    python broker_peers.py service fd:N     hello, accept connections (echo upper-cased), print
                                            "ended <attempt>" per ended; exit 0 on channel EOF
    python broker_peers.py job fd:N COUNT   COUNT connects; on each, send "ping <i>" and print
                                            the reply; exit 0
    python broker_peers.py flood fd:N COUNT COUNT connect lines as fast as the answers come
                                            (at most FLOOD_WINDOW unanswered), replies read by
                                            a second thread; print "ok=<n> refused=<m>"
"""

from __future__ import annotations

import os
import socket
import sys
import threading

from oarbank_sdk.protocol import current_transport, wire

T = current_transport()


class Lines:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.split = wire.LineSplitter()
        self.lines: list[bytes] = []
        self.fds: list[int] = []

    def read(self) -> tuple[dict | None, list[int]]:
        while not self.lines:
            data, fds = T.recv(self.sock, 65536)
            self.fds.extend(fds)
            if not data:
                return None, []
            self.lines.extend(self.split.feed(data))
        msg = wire.decode(self.lines.pop(0))
        fds, self.fds = self.fds, []
        return msg, fds


def serve_connection(sock: socket.socket) -> None:
    with sock:
        while True:
            data = sock.recv(65536)
            if not data:
                return
            sock.sendall(data.upper())


def service(handle: str) -> int:
    chan = T.open_stream(T.parse(handle))
    chan.sendall(wire.encode({"op": "hello", "pid": os.getpid()}))
    reader = Lines(chan)
    while True:
        msg, fds = reader.read()
        if msg is None:
            return 0
        parsed = wire.parse_to_service(msg)
        if isinstance(parsed, wire.Ended):
            print(f"ended {parsed.attempt}", flush=True)
            continue
        (fd,) = fds
        chan.sendall(wire.encode({"op": "accepted", "conn": parsed.conn}))
        conn = socket.socket(fileno=fd)
        threading.Thread(target=serve_connection, args=(conn,), daemon=True).start()


def job(handle: str, count: int) -> int:
    sock = T.open_stream(T.parse(handle))
    reader = Lines(sock)
    for i in range(count):
        sock.sendall(wire.encode({"op": "connect", "pid": os.getpid()}))
        msg, fds = reader.read()
        assert msg is not None, "connector closed"
        reply = wire.parse_reply_to_job(msg)
        if isinstance(reply, wire.Refusal):
            print(f"refused {reply.error}: {reply.detail}", flush=True)
            return 1
        (fd,) = fds
        sock.sendall(wire.encode({"op": "received", "conn": reply.conn}))
        with socket.socket(fileno=fd) as conn:
            conn.sendall(f"ping {i}".encode())
            conn.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        print(answer.decode(), flush=True)
    return 0


# Lines in flight, unanswered: enough to keep the broker's rate limit busy, never so many
# that the answers waiting for a slow reader pass the connector's send cap (connector.py,
# CONNECTOR_MAX_OUT 256 KiB; an answer is under 200 bytes), which would cut it off as a peer
# that is "not reading" (on a loaded machine the reader thread falls that far behind).
FLOOD_WINDOW = 1000
FLOOD_BATCH = 100


def flood(handle: str, count: int) -> int:
    sock = T.open_stream(T.parse(handle))
    counts = {"ok": 0, "refused": 0}
    answered = threading.Condition()

    def read_all() -> None:
        reader = Lines(sock)
        while counts["ok"] + counts["refused"] < count:
            msg, fds = reader.read()
            if msg is None:
                break
            for fd in fds:
                os.close(fd)
            with answered:
                counts["ok" if msg.get("ok") else "refused"] += 1
                answered.notify()
        with answered:
            counts["eof"] = 1  # nothing more will come: the writer must not wait for it
            answered.notify()

    t = threading.Thread(target=read_all)
    t.start()
    line = wire.encode({"op": "connect", "pid": os.getpid()})
    sent = 0
    while sent < count:
        with answered:
            answered.wait_for(lambda n=sent: "eof" in counts or
                              n - counts["ok"] - counts["refused"] <= FLOOD_WINDOW, 60)
            if "eof" in counts:
                break
        n = min(FLOOD_BATCH, count - sent)
        sock.sendall(line * n)
        sent += n
    t.join(60)
    print(f"ok={counts['ok']} refused={counts['refused']}", flush=True)
    return 0


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "service":
        sys.exit(service(sys.argv[2]))
    if role == "job":
        sys.exit(job(sys.argv[2], int(sys.argv[3])))
    if role == "flood":
        sys.exit(flood(sys.argv[2], int(sys.argv[3])))
    sys.exit(f"unknown role {role!r}")
