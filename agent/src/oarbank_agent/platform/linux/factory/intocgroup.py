"""Fork a child straight into its cgroup: ``clone3(CLONE_INTO_CGROUP)``, as ``os.fork`` does
around ``fork()``.

Why: a child that writes its pid to ``cgroup.procs`` after the fork takes the kernel's
threadgroup lock for writing, whose RCU grace period costs 8-10 ms per child on a cgroup2
mount without ``favordynmods`` (docs/measurements/2026-12-02-per-connect-and-per-job-cost.md).
A child born in its cgroup takes the read side only, which every fork takes anyway, and is never
outside it.

The fork is ``os.fork``'s own recipe with the system call swapped: ``PyOS_BeforeFork``, the
call with the interpreter lock held, then ``PyOS_AfterFork_Child`` or ``_Parent`` (the
public C API ``os.fork`` is made of). The factory is single-threaded, as ``os.fork`` needs.

Where the kernel or a filter refuses (``ENOSYS``: no clone3, or a container's seccomp
profile; ``EINVAL``/``EOPNOTSUPP``: not a cgroup2 directory; ``EPERM``/``EACCES``), ``fork_into``
says so by returning None and the caller forks and joins the old way, whose own refusal is
the one a user sees.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
from typing import Any

__all__ = ["fork_into", "CLONE_INTO_CGROUP"]

CLONE_INTO_CGROUP = 0x200000000
# Numbers from 424 on are the same on every architecture (Linux 5.1's unified table).
_SYS_CLONE3 = 435
_FALL_BACK = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES,
              errno.EBUSY, errno.ENOENT, errno.ENOTDIR, errno.EBADF}  # EBADF: a v1 cgroup


class _CloneArgs(ctypes.Structure):  # struct clone_args (linux/sched.h), version 2
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size",
        "tls", "set_tid", "set_tid_size", "cgroup")]


_unsupported = False  # ENOSYS learnt once: every later spawn forks the old way
_calls: tuple[Any, Any] | None = None  # (the interpreter's C API, syscall): at the first fork


def _bind() -> tuple[Any, Any]:
    """The C functions, looked up at the first fork (importing this module binds nothing)."""
    global _calls
    if _calls is None:
        api = ctypes.pythonapi  # PyDLL: the interpreter lock stays held across each call
        syscall = ctypes.PyDLL(None, use_errno=True).syscall
        syscall.restype = ctypes.c_long
        syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t]
        for name in ("PyOS_BeforeFork", "PyOS_AfterFork_Parent", "PyOS_AfterFork_Child"):
            getattr(api, name).restype = None
            getattr(api, name).argtypes = []
        _calls = (api, syscall)
    return _calls


def fork_into(cgroup_dir: str) -> int | None:
    """The child's pid (0 in the child), born in ``cgroup_dir``; None where this system will
    not (the caller forks the old way). OSError for a fork that failed for want of room
    (EAGAIN, ENOMEM), as ``os.fork`` raises it."""
    global _unsupported
    if _unsupported:
        return None
    try:
        cg = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None  # the old way's join names what is wrong with it
    pid, err = -1, 0
    try:
        api, syscall = _bind()
        args = _CloneArgs(flags=CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=cg)
        api.PyOS_BeforeFork()
        pid = syscall(_SYS_CLONE3, ctypes.addressof(args), ctypes.sizeof(args))
        if pid == 0:
            api.PyOS_AfterFork_Child()
            return 0
        err = ctypes.get_errno()
        api.PyOS_AfterFork_Parent()
    finally:
        os.close(cg)  # in the child too: a script run in place must not inherit it
    if pid > 0:
        return pid
    if err == errno.ENOSYS:
        _unsupported = True
    if err in _FALL_BACK:
        return None
    raise OSError(err, os.strerror(err))
