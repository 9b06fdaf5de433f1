"""The keeper process: holds the agent's ends of endpoint channels while no agent runs, and
gives them only to the next agent of the same user on the same state dir.

States (one process per state dir, started by an agent with ``--keep-services``):

- **owned**: its agent is connected; it ``keep``s an end (a duplicate: the agent keeps its
  own), ``note``s a newer record, ``drop``s an end when the service stops.
- **waiting**: its agent went away (killed, crashed, stopped keeping its services); it holds
  the ends, so their services see no end of file, until an agent asks to ``take`` them.
- **handed over**: every end and record was sent to the asking agent; it exits.

A connection is served only when the system says its peer is this keeper's user (where it
can say), the peer shows an open descriptor of this state dir's lock file, and only for this
keeper's state dir. Held ends whose service closed its side are dropped; it exits
once it holds nothing and has no agent (nothing to keep warm).
"""

from __future__ import annotations

import os
import select
import socket
import sys
import time
from pathlib import Path
from typing import Any

from oarbank_agent import platform
from oarbank_agent.operate.statedir import LOCK_NAME

__all__ = ["main", "SOCKET_NAME", "LOG_NAME"]

SOCKET_NAME = "keeper.sock"
LOG_NAME = "keeper.log"
CHECK_S = 1.0  # held ends are looked at this often (a service that died is let go)
FIRST_OWNER_S = 30.0  # started for an agent that never came: nothing to keep


def _say(text: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    print(f"{stamp} keeper {os.getpid()}: {text}", file=sys.stderr, flush=True)


class Keeper:
    def __init__(self, state_dir: Path) -> None:
        host = platform.current().keeper
        assert host is not None, "no keeper on this platform"
        self.host = host
        self.state_dir = state_dir
        self.uid = os.getuid()
        self.listener = host.listen(state_dir / SOCKET_NAME)
        self.owner: socket.socket | None = None
        self.ever_owned = False
        # key -> (its record, its channel end, the rest: the read end of its log pipe)
        self.held: dict[str, tuple[dict[str, Any], socket.socket, list[int]]] = {}
        self.started = time.monotonic()

    def run(self) -> None:
        _say(f"holding channel ends for {self.state_dir}")
        try:
            while not self._done():
                listening = [self.listener] if self.listener.fileno() != -1 else []
                watched = listening + ([self.owner] if self.owner else [])
                readable, _, _ = select.select(watched, [], [], CHECK_S)
                if self.owner is not None and self.owner in readable:
                    self._from_owner()
                if listening and self.listener in readable:
                    self._accept()
                self._let_go_of_dead()
        finally:
            self._close()

    def _done(self) -> bool:
        if self.owner is not None or self.held:
            return False
        return self.ever_owned or time.monotonic() - self.started > FIRST_OWNER_S

    # --- the owner ----------------------------------------------------------------------------

    def _from_owner(self) -> None:
        assert self.owner is not None
        try:
            doc, fds = self.host.recv(self.owner)
        except (ConnectionError, OSError, ValueError) as exc:
            # owned -> waiting (or done, holding nothing)
            _say(f"its agent went away ({exc}); holding {len(self.held)} end(s)")
            self.owner.close()
            self.owner = None
            return
        op, record = doc.get("op"), doc.get("record")
        key = str(record.get("key")) if isinstance(record, dict) else str(doc.get("key"))
        if op == "keep" and fds and isinstance(record, dict):
            self._forget(key)
            self.held[key] = (record, socket.socket(fileno=fds[0]), fds[1:])
            _say(f"keeps the channel end of {key}" + (" and its log" if fds[1:] else ""))
            return
        for fd in fds:
            os.close(fd)
        if op == "note" and isinstance(record, dict) and key in self.held:
            self.held[key] = (record, *self.held[key][1:])
        elif op == "drop" and key in self.held:
            self._forget(key)
            _say(f"let go of {key}: its agent stopped it")

    def _forget(self, key: str) -> None:
        entry = self.held.pop(key, None)
        if entry is not None:
            entry[1].close()
            for fd in entry[2]:
                os.close(fd)

    # --- a new connection ---------------------------------------------------------------------

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        try:
            conn.settimeout(5.0)
            uid = self.host.peer_uid(conn)
            if uid is not None and uid != self.uid:
                _say(f"refused a connection of uid {uid} (not {self.uid})")
                conn.close()
                return
            doc, fds = self.host.recv(conn)
            fd = fds.pop(0) if fds else None
            for extra in fds:
                os.close(extra)
            if os.path.realpath(str(doc.get("state_dir"))) != os.path.realpath(self.state_dir):
                if fd is not None:
                    os.close(fd)
                self.host.send(conn, {"ok": False, "why": f"this keeper is for {self.state_dir}"})
                conn.close()
                return
            if not self._proven(fd):
                self.host.send(conn, {"ok": False, "why": "no proof of this state dir's lock"})
                conn.close()
                return
            if self.owner is not None and self.host.peer_gone(self.owner):
                self._from_owner()  # the old agent is gone; its end of file was not read yet
            if self.owner is not None:
                self.host.send(conn, {"ok": False, "why": "an agent owns this keeper"})
                conn.close()
            elif doc.get("op") == "own":
                # waiting|new -> owned
                self.host.send(conn, {"ok": True, "held": len(self.held)})
                conn.settimeout(None)
                self.owner, self.ever_owned = conn, True
                _say("owned by a new agent")
            elif doc.get("op") == "take":
                self._hand_over(conn)
            else:
                conn.close()
        except (ConnectionError, OSError, ValueError) as exc:
            _say(f"a connection failed: {exc}")
            conn.close()

    def _proven(self, fd: int | None) -> bool:
        """The peer passed an open descriptor of this state dir's lock file, ours: only a
        process of this user (the state dir is its alone) could open it. Checked on every
        system, also where the peer's uid cannot be asked (the darwin profile)."""
        if fd is None:
            return False
        try:
            have, ref = os.fstat(fd), os.stat(self.state_dir / LOCK_NAME)
        except OSError:
            return False
        finally:
            os.close(fd)
        return ((have.st_dev, have.st_ino) == (ref.st_dev, ref.st_ino)
                and have.st_uid == self.uid)

    def _hand_over(self, conn: socket.socket) -> None:
        """waiting -> handed over: every record with its end, then nothing is held. The socket
        goes first, so the keeper the next agent starts is the only one there."""
        self._unlisten()
        self.host.send(conn, {"ok": True, "count": len(self.held)})
        for key, (record, end, rest) in list(self.held.items()):
            self.host.send(conn, {"record": record}, (end.fileno(), *rest))
            self._forget(key)
        conn.close()
        self.ever_owned = True
        _say("handed every channel end to the next agent")

    def _let_go_of_dead(self) -> None:
        for key in [k for k, (_r, end, _rest) in self.held.items() if self.host.peer_gone(end)]:
            self._forget(key)
            _say(f"let go of {key}: the service closed its channel")

    def _unlisten(self) -> None:
        if self.listener.fileno() == -1:
            return
        self.listener.close()
        try:
            (self.state_dir / SOCKET_NAME).unlink()
        except FileNotFoundError:
            pass

    def _close(self) -> None:
        for key in list(self.held):
            self._forget(key)
        if self.owner is not None:
            self.owner.close()
        self._unlisten()
        _say("exits: it holds nothing")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m oarbank_agent.keep STATE_DIR", file=sys.stderr)
        return 2
    Keeper(Path(argv[0]).resolve()).run()
    return 0
