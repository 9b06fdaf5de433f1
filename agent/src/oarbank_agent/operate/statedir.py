"""The agent's state dir is the agent's alone: its user's, mode 0700, one agent at a time.

``prepare(state_dir)`` runs in ``oarbank-agent run`` before anything reads or writes the state
dir (before restart recovery, before the control socket):

What "the user's" and "private" are is the backend's (``statedir.claim`` and
``open_private``: on POSIX the uid and the modes below; on Windows the owner's SID and a
protected DACL):

- a state dir that exists but belongs to another user is refused (``StateDirError``, exit 2):
  whoever owns it could plant job records, process records or settings that this agent
  would trust after a restart;
- a new one is made 0700; an existing one of ours is tightened to 0700 (group and others lose
  access: what the agent writes there is nobody else's business);
- ``agent.lock`` (0600) is locked (the backend's ``statedir.try_lock``) and holds the
  agent's pid. A second agent on the same state dir finds it locked and exits 2 naming that
  pid, instead of ending the first agent's process groups as a predecessor's and unlinking
  its live control socket. The kernel drops the lock when the holder dies (``kill -9``
  included), so a crashed agent never blocks the next one; the pid in the file is only for
  the message.

With the agent's umask (``0o077``, set by ``run``) every file and folder it creates afterwards
is 0600/0700 too.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from oarbank_agent import platform
from oarbank_agent.platform.api import StateDirRefused

__all__ = ["LOCK_NAME", "UMASK", "StateDirError", "AgentLock", "prepare"]

LOCK_NAME = "agent.lock"
UMASK = 0o077


class StateDirError(Exception):
    """The state dir cannot be used by this agent (the message says why)."""


class AgentLock:
    """The held ``agent.lock``; ``close`` releases it (the process exiting does too)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 64).decode("ascii", "replace").strip()
        if text:
            return f"pid {int(text)}"
    return "a pid it has not written yet"


def prepare(state_dir: Path) -> AgentLock:
    """Check, create or tighten ``state_dir`` and take its lock (see the module docstring)."""
    host = platform.current().statedir
    path = Path(os.path.abspath(state_dir))
    lock_path = path / LOCK_NAME
    try:
        host.claim(path)
        fd = host.open_private(lock_path)
    except StateDirRefused as exc:
        raise StateDirError(str(exc)) from None
    try:
        try:
            taken = host.try_lock(fd)
        except OSError as exc:
            raise StateDirError(f"cannot lock {lock_path}: {exc.strerror}") from None
        if not taken:
            raise StateDirError(
                f"another agent ({_holder(fd)}) is running on the state dir {path}: it holds "
                f"{lock_path}; stop it first (this one exits without touching the state dir)")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return AgentLock(lock_path, fd)
