"""The agent's state dir is the agent's alone: its user's, mode 0700, one agent at a time.

``prepare(state_dir)`` runs in ``oarbank-agent run`` before anything reads or writes the state
dir (before restart recovery, before the control socket):

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
import stat
from pathlib import Path

from oarbank_agent import platform

__all__ = ["LOCK_NAME", "UMASK", "StateDirError", "AgentLock", "prepare"]

LOCK_NAME = "agent.lock"
UMASK = 0o077


class StateDirError(Exception):
    """The state dir cannot be used by this agent (the message says why)."""


def _user(uid: int) -> str:
    name = platform.current().statedir.user_name(uid)
    return f"uid {uid}" if name is None else f"uid {uid} ({name})"


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
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        if text:
            return f"pid {int(text)}"
    return "a pid it has not written yet"


def prepare(state_dir: Path) -> AgentLock:
    """Check, create or tighten ``state_dir`` and take its lock (see the module docstring)."""
    me = os.geteuid()
    path = Path(os.path.abspath(state_dir))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # made meanwhile (by another agent starting): checked like any existing one
        except OSError as exc:
            raise StateDirError(f"cannot create the state dir {path}: {exc.strerror}") from None
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"the state dir {path} exists and is not a folder")
    if st.st_uid != me:
        raise StateDirError(
            f"the state dir {path} belongs to {_user(st.st_uid)}, not to this agent's user "
            f"({_user(me)}): refusing to use a folder another user can write (its job and "
            f"process records would be trusted); use a new folder or chown it")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    lock_path = path / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StateDirError(f"cannot open {lock_path}: {exc.strerror}") from None
    try:
        if os.fstat(fd).st_uid != me:
            raise StateDirError(f"{lock_path} belongs to {_user(os.fstat(fd).st_uid)}, not to "
                                f"this agent's user ({_user(me)})")
        try:
            taken = platform.current().statedir.try_lock(fd)
        except OSError as exc:
            raise StateDirError(f"cannot lock {lock_path}: {exc.strerror}") from None
        if not taken:
            raise StateDirError(
                f"another agent ({_holder(fd)}) is running on the state dir {path}: it holds "
                f"{lock_path}; stop it first (this one exits without touching the state dir)")
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return AgentLock(lock_path, fd)
