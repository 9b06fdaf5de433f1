"""The host's ends of a VM node's two virtio serial ports (QEMU serves each as a unix socket
in the node's folder; see harness.nodes.vm.guest for the other ends).

`Control`: requests to the guest helper (run a command, write, read or find files, list the
node's processes), several at once, each answered by id. `PortalForward`: every connection
the agent makes to the portal inside the guest becomes a connection to the portal's unix
socket here. Nothing here listens on any network.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.nodes.vm.guest import Mux

__all__ = ["ChannelError", "Control", "PortalForward", "connect_unix"]


class ChannelError(RuntimeError):
    """The guest did not answer, or answered with an error (the message says which)."""


def connect_unix(path: Path, wait_s: float) -> socket.socket:
    """Connect to QEMU's socket at `path`, waiting for QEMU to create it."""
    deadline = time.monotonic() + wait_s
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(path))
            return s
        except OSError as exc:
            s.close()
            if time.monotonic() > deadline:
                raise ChannelError(f"cannot connect to {path}: {exc}") from exc
            time.sleep(0.05)


class Control:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.hello: dict[str, Any] | None = None
        self._hello = threading.Event()
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self._wlock = threading.Lock()
        self._gone = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        self._dispatch(json.loads(line))
        except (OSError, ValueError):
            return
        finally:
            self._gone.set()
            with self._lock:
                for ev, _ in self._waiting.values():
                    ev.set()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "hello" in msg:
            self.hello = msg["hello"]
            self._hello.set()
            return
        with self._lock:
            slot = self._waiting.get(msg.get("id", -1))
        if slot is not None:
            slot[1].append(msg)
            slot[0].set()

    def wait_hello(self, timeout_s: float,
                   stalled: Callable[[], str | None] | None = None) -> dict[str, Any]:
        """The helper's first line: the guest is up (its kernel, Landlock ABI). ``stalled``,
        asked every second: why the guest will never get there (ChannelError at once)."""
        for tick in range(int(timeout_s * 10)):
            if self._hello.wait(0.1) or self._gone.is_set():
                break
            why = stalled() if stalled is not None and tick % 10 == 9 else None
            if why:
                raise ChannelError(why)
        if self.hello is None:
            raise ChannelError(f"the guest did not say hello within {timeout_s:.0f} s"
                               + (" (its control port closed)" if self._gone.is_set() else ""))
        return self.hello

    def request(self, op: str, wait_s: float = 60.0, **args: Any) -> dict[str, Any]:
        """Send `op` with `args`; its answer (ChannelError when none comes within `wait_s`
        or the guest answers with an error)."""
        rid = next(self._ids)
        ev: threading.Event = threading.Event()
        box: list[dict[str, Any]] = []
        with self._lock:
            self._waiting[rid] = (ev, box)
        try:
            line = (json.dumps({"id": rid, "op": op, **args}) + "\n").encode()
            with self._wlock:
                self.sock.sendall(line)
            ev.wait(wait_s)
        except OSError as exc:
            raise ChannelError(f"{op}: the guest's control port: {exc}") from exc
        finally:
            with self._lock:
                self._waiting.pop(rid, None)
        if not box:
            why = "the control port closed" if self._gone.is_set() else \
                f"no answer within {wait_s:.0f} s"
            raise ChannelError(f"{op}: {why}")
        msg = box[0]
        if not msg.get("ok"):
            raise ChannelError(f"{op} failed in the guest: {msg.get('error')}")
        return msg

    # --- what the node uses -----------------------------------------------------------------

    def run(self, argv: list[str], timeout_s: float = 120.0) -> tuple[int, str, str]:
        r = self.request("exec", timeout_s + 30, argv=argv, timeout_s=timeout_s)
        return int(r["rc"]), str(r["stdout"]), str(r["stderr"])

    def write(self, path: str, data: bytes, *, mode: int = 0o644, owner: str | None = None,
              append: bool = False) -> None:
        self.request("write", path=path, data=base64.b64encode(data).decode(), mode=mode,
                     owner=owner, append=append)

    def read(self, path: str, tail: int | None = None) -> bytes | None:
        r = self.request("read", path=path, **({"tail": tail} if tail else {}))
        return None if r["data"] is None else base64.b64decode(r["data"])

    def find(self, root: str, name: str) -> list[tuple[str, bytes]]:
        r = self.request("find", root=root, name=name)
        return [(f["rel"], base64.b64decode(f["data"])) for f in r["files"]]

    def procs(self, user: str, cgroup: str) -> list[dict[str, Any]]:
        return list(self.request("procs", user=user, cgroup=cgroup)["procs"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._reader.join(5)


class PortalForward:
    """Connections the agent opens in the guest -> connections to `portal_socket` here."""

    def __init__(self, sock: socket.socket, portal_socket: Path | None) -> None:
        self.sock = sock

        def connect() -> socket.socket:
            if portal_socket is None:
                raise OSError("this node has no portal")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(str(portal_socket))
            except OSError:
                s.close()
                raise
            return s

        self.mux = Mux(self._recv, sock.sendall, connect)
        self._thread = threading.Thread(target=self.mux.run, daemon=True)
        self._thread.start()

    def _recv(self, n: int) -> bytes:
        try:
            return self.sock.recv(n)
        except OSError:
            return b""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(5)
