"""The state-dir lock on POSIX: ``flock`` on ``agent.lock``, user names from ``pwd``, the umask.

``flock`` (not ``fcntl`` record locks): the lock belongs to the open file, so it is dropped
when the descriptor is closed or the holder dies (``kill -9`` included), and a descriptor the
agent's children never inherit (close-on-exec) cannot keep it. Linux reads the umask from
``/proc/self/status``; elsewhere (and where that fails) it is set and put back at once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd

__all__ = ["PosixStateDir"]


class PosixStateDir:
    """``api.StateDirHost``; ``proc_status``: read the umask from ``/proc`` (Linux)."""

    def __init__(self, *, proc_status: bool) -> None:
        self.proc_status = proc_status

    def try_lock(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        return True

    def user_name(self, uid: int) -> str | None:
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return None

    def umask(self) -> int:
        if self.proc_status:
            with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("Umask:"):
                        return int(line.split()[1], 8)
        mask = os.umask(0o077)
        os.umask(mask)
        return mask
