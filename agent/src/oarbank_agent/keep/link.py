"""The agent's side of the keeper: take what a previous agent's keeper holds (at start, before
anything is ended), start this agent's own keeper, and tell it what to keep and let go of.

Every call is a short message on a local socket; a keeper that died under the agent is logged
once and no longer used (its services are then stopped by the next agent, as without
``--keep-services``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from oarbank_agent import platform
from oarbank_agent.keep.keeper import LOG_NAME, SOCKET_NAME
from oarbank_agent.keep.record import KeptService
from oarbank_agent.operate.statedir import LOCK_NAME

__all__ = ["Taken", "take_over", "KeeperLink"]

log = logging.getLogger("oarbank_agent.keep")

START_S = 10.0  # a keeper not answering this long after it was started is a failed start

# What came back from a previous agent's keeper: a record (None: unreadable), its channel end
# and the read end of its log pipe (None: it had none).
Taken = dict[str, tuple[KeptService | None, socket.socket, int | None]]


def _hello(sock: socket.socket, op: str, state_dir: Path) -> dict[str, object]:
    """``op`` (own | take) for ``state_dir``, with the proof the keeper asks: an open
    descriptor of the state dir's lock file."""
    host = platform.current().keeper
    assert host is not None
    proof = os.open(state_dir / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    try:
        host.send(sock, {"op": op, "state_dir": str(state_dir)}, (proof,))
    finally:
        os.close(proof)
    reply, fds = host.recv(sock)
    for fd in fds:
        os.close(fd)
    if reply.get("ok") is not True:
        raise ConnectionError(str(reply.get("why", "refused")))
    return reply


def take_over(state_dir: Path) -> Taken:
    """Every end a previous agent's keeper holds, with its record (the keeper then exits)."""
    host = platform.current().keeper
    path = state_dir / SOCKET_NAME
    if host is None or not path.exists():
        return {}
    sock = host.connect(path, 5.0)
    if sock is None:
        log.info("keeper: a stale socket, no keeper behind it: removed")
        path.unlink(missing_ok=True)
        return {}
    taken: Taken = {}
    with sock:
        count = int(_hello(sock, "take", state_dir).get("count", 0))  # type: ignore[call-overload]
        for _ in range(count):
            doc, fds = host.recv(sock)
            if not fds:
                continue
            end, log_fd = socket.socket(fileno=fds[0]), (fds[1] if len(fds) > 1 else None)
            for extra in fds[2:]:
                os.close(extra)
            raw = doc.get("record")
            try:
                rec = KeptService.from_doc(raw if isinstance(raw, dict) else {})
                key = rec.key
            except ValueError as exc:
                log.warning("keeper: %s: its service will be stopped", exc)
                rec, key = None, str(raw.get("key") if isinstance(raw, dict) else "?")
            taken[key] = (rec, end, log_fd)
    log.info("keeper: took %d channel end(s) from the previous agent's keeper", len(taken))
    return taken


class KeeperLink:
    """This agent's keeper, once ``start``ed."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._sock: socket.socket | None = None
        self.pid: int | None = None

    @property
    def up(self) -> bool:
        return self._sock is not None

    async def start(self) -> None:
        """Start the keeper (a session of its own: neither a signal to the agent's group nor
        the agent's death reaches it) and own it. Raises OSError when it does not answer."""
        host = platform.current().keeper
        if host is None:
            raise OSError("this platform has no keeper for --keep-services")
        path = self.state_dir / SOCKET_NAME
        with open(self.state_dir / LOG_NAME, "ab") as err:
            proc = platform.current().sessions.start(
                [sys.executable, "-I", "-m", "oarbank_agent.keep", str(self.state_dir)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, close_fds=True)
        self.pid = proc.pid
        deadline = time.monotonic() + START_S
        while True:
            sock = host.connect(path, 5.0) if path.exists() else None
            if sock is not None:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise OSError(f"the keeper did not start (see {self.state_dir / LOG_NAME})")
            await asyncio.sleep(0.02)  # its interpreter starting: the agent serves meanwhile
        try:
            _hello(sock, "own", self.state_dir)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(5.0)
        self._sock = sock
        log.info("keeper: pid %d keeps the endpoint channels across a restart", proc.pid)

    def _send(self, doc: dict[str, object], fds: tuple[int, ...] = ()) -> None:
        host = platform.current().keeper
        if self._sock is None or host is None:
            return
        try:
            host.send(self._sock, doc, fds)
        except OSError as exc:
            log.warning("keeper: lost (%s): services will not be kept across a restart", exc)
            self._sock.close()
            self._sock = None

    def keep(self, rec: KeptService, fds: tuple[int, ...]) -> None:
        """Keep a duplicate of each of ``fds``: the channel end, then its log pipe's."""
        self._send({"op": "keep", "record": rec.to_doc()}, fds)

    def note(self, rec: KeptService) -> None:
        self._send({"op": "note", "record": rec.to_doc()})

    def drop(self, key: str) -> None:
        self._send({"op": "drop", "key": key})

    def close(self) -> None:
        """The agent goes: the keeper holds what it was given, or exits holding nothing."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
