"""The state dir on POSIX: the user's own (its uid, mode 0700, the lock file 0600 and never
followed through a link), ``flock`` on ``agent.lock``, user names from ``pwd``, the umask.

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
import stat
from pathlib import Path

from oarbank_agent.platform.api import StateDirRefused

__all__ = ["PosixStateDir"]


class PosixStateDir:
    """``api.StateDirHost``; ``proc_status``: read the umask from ``/proc`` (Linux)."""

    def __init__(self, *, proc_status: bool) -> None:
        self.proc_status = proc_status

    def claim(self, path: Path) -> None:
        me = os.geteuid()
        try:
            st = os.stat(path)
        except FileNotFoundError:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass  # made meanwhile (another agent starting): checked like any existing one
            except OSError as exc:
                raise StateDirRefused(
                    f"cannot create the state dir {path}: {exc.strerror}") from None
            st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise StateDirRefused(f"the state dir {path} exists and is not a folder")
        if st.st_uid != me:
            raise StateDirRefused(
                f"the state dir {path} belongs to {self._user(st.st_uid)}, not to this agent's "
                f"user ({self._user(me)}): refusing to use a folder another user can write (its "
                f"job and process records would be trusted); use a new folder or chown it")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(path, 0o700)  # group and others lose access

    def open_private(self, path: Path) -> int:
        me = os.geteuid()
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise StateDirRefused(f"cannot open {path}: {exc.strerror}") from None
        try:
            owner = os.fstat(fd).st_uid
            if owner != me:
                raise StateDirRefused(f"{path} belongs to {self._user(owner)}, not to this "
                                      f"agent's user ({self._user(me)})")
            os.fchmod(fd, 0o600)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def others_may_read(self, path: Path, fd: int) -> str | None:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:
            return f"mode {mode:04o} lets the group or others read it; chmod 600 {path}"
        return None

    def _user(self, uid: int) -> str:
        name = self.user_name(uid)
        return f"uid {uid}" if name is None else f"uid {uid} ({name})"

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
