"""A small ctypes binding of Landlock's three system calls (Linux >= 5.13), for the launcher.

Why not the ``landlock`` package on PyPI (1.0.0.dev5, read before choosing): it covers only
filesystem rights (no ``handled_access_net``, no ``scoped`` field, so no signal or abstract
unix scoping of ABI 6); it decides failure by ``errno != 0`` after the call (a stale errno from
an earlier call reads as a failure, a real one can be masked); it imports ``enum``,
``dataclasses``, ``functools`` and ``platform`` on every start (the launcher runs once per
process start, where ~15 ms is a budget); and it is a pre-release, a dependency to vet and pin
for ~60 lines of structs and three ``syscall()`` calls. This module has no import beyond
``ctypes`` and ``os`` (the launcher already loads both).

Only what the launcher needs: ``abi()``, ``restrict(read, write, devices, scope)``.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["abi", "restrict", "LandlockError", "SCOPE_ABSTRACT_UNIX_SOCKET", "SCOPE_SIGNAL"]

# Same numbers on every architecture (the unified syscall table of Linux >= 5.13).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

# Filesystem rights (include/uapi/linux/landlock.h).
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
# Network rights (ABI 4): handled with no rule = refused (TCP bind/connect).
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
# Scopes (ABI 6).
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV


class LandlockError(OSError):
    pass


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel struct is __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = None


def _syscall():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


def abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is absent or disabled."""
    rc = _syscall()(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                    ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return int(rc) if rc > 0 else 0


def fs_rights(version: int) -> int:
    """Every filesystem right this ABI version knows (all handled = deny unless granted)."""
    rights = (1 << 13) - 1
    if version >= 2:
        rights |= REFER
    if version >= 3:
        rights |= TRUNCATE
    if version >= 5:
        rights |= IOCTL_DEV
    return rights


def _fail(what: str) -> LandlockError:
    err = ctypes.get_errno()
    return LandlockError(err, f"{what}: {os.strerror(err)}")


def restrict(version: int, read: list[str], write: list[str], devices: list[str],
             scope: int) -> int:
    """Restrict this thread (and what it execs) to ``read`` (read + execute), ``write`` (every
    right but MAKE_SOCK), ``devices`` (read, write, ioctl) and the ``scope`` flags (ABI >= 6).
    Paths that do not exist are skipped (nothing is granted for them). Needs no_new_privs
    already set. Returns the scope flags applied. Raises ``LandlockError``."""
    handled = fs_rights(version)
    attr = _RulesetAttr(handled, (NET_BIND_TCP | NET_CONNECT_TCP) if version >= 4 else 0,
                        scope if version >= 6 else 0)
    size = 24 if version >= 6 else 16 if version >= 4 else 8
    call = _syscall()
    fd = call(ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
              ctypes.c_uint32(0))
    if fd < 0:
        raise _fail("landlock_create_ruleset")
    try:
        read_rights = EXECUTE | READ_FILE | READ_DIR
        dev_rights = (READ_FILE | WRITE_FILE | READ_DIR | TRUNCATE | IOCTL_DEV) & handled
        # No folder grants MAKE_SOCK: no process of a sandbox ever names a socket in the
        # filesystem (a GPU child's driver may listen, on an abstract name only: _policy).
        write_rights = handled & ~MAKE_SOCK
        for paths, rights in ((read, read_rights), (write, write_rights),
                              (devices, dev_rights)):
            for path in paths:
                _add(call, fd, path, rights)
        if call(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise _fail("landlock_restrict_self")
    finally:
        os.close(fd)
    return attr.scoped


def _add(call, ruleset_fd: int, path: str, rights: int) -> None:
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # nothing there: nothing granted
    try:
        if os.fstat(pfd).st_mode & 0o170000 != 0o040000:  # not a directory
            rights &= _FILE_RIGHTS  # a file takes file rights only (EINVAL otherwise)
        rule = _PathBeneath(rights, pfd)
        if call(ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(ruleset_fd),
                ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise _fail(f"landlock_add_rule({path})")
    finally:
        os.close(pfd)
