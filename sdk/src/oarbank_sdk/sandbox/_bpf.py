"""A seccomp filter as its BPF program: exported once with libseccomp, installed with one system call.

``seccomp_export_bpf`` writes the program ``seccomp_load`` would load; ``load_program`` installs
it with the flags libseccomp uses, so a forked child that inherits a ``Program`` never calls
libseccomp (``_linux.prebuild``). Imports nothing beyond what the launcher already loaded.
"""

from __future__ import annotations

import ctypes
import os
import types

__all__ = ["Program", "export", "load_program"]

# seccomp(2) as libseccomp's seccomp_load calls it with its defaults (no TSYNC, LOG or
# SPEC_ALLOW flag; NEW_LISTENER when a rule notifies, and the call returns the listener).
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
_BPF_INSN = 8  # sizeof(struct sock_filter)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Program:
    """One filter as the BPF program libseccomp generates for it (``seccomp_export_bpf``: the
    program ``seccomp_load`` would load), with ``seccomp(2)``'s number on this machine."""

    __slots__ = ("bpf", "nr", "notifies", "_buf", "fprog")

    def __init__(self, bpf: bytes, nr: int, notifies: bool) -> None:
        self.bpf = bpf
        self.nr = nr
        self.notifies = notifies
        self._buf = ctypes.create_string_buffer(bpf, len(bpf))
        self.fprog = _SockFprog(len(bpf) // _BPF_INSN, ctypes.addressof(self._buf))


def export(pyseccomp, filt, notifies: bool) -> Program | None:
    """``filt`` as BPF; None where this machine cannot export it (no ``memfd_create``, no
    number for ``seccomp(2)``): then libseccomp loads the filter itself, as before."""
    try:
        nr = int(pyseccomp.resolve_syscall(pyseccomp.system_arch(), "seccomp"))
        fd = os.memfd_create("oarbank-seccomp", os.MFD_CLOEXEC)
    except (AttributeError, OSError, ValueError, RuntimeError):
        return None
    try:
        filt.export_bpf(types.SimpleNamespace(fileno=lambda: fd))
        bpf = os.pread(fd, os.fstat(fd).st_size, 0)
    except (OSError, ValueError, RuntimeError):
        return None
    finally:
        os.close(fd)
    if nr <= 0 or not bpf or len(bpf) % _BPF_INSN or len(bpf) // _BPF_INSN > 0xFFFF:
        return None
    return Program(bpf, nr, notifies)


def load_program(libc: ctypes.CDLL, program: Program) -> int:
    """Install ``program`` on this process: one system call. Returns the listener (notifying
    programs), else -1. Raises ``OSError``."""
    flags = _SECCOMP_FILTER_FLAG_NEW_LISTENER if program.notifies else 0
    rc = libc.syscall(ctypes.c_long(program.nr), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                      ctypes.c_long(flags), ctypes.byref(program.fprog))
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp(SECCOMP_SET_MODE_FILTER): {os.strerror(err)}")
    return int(rc) if program.notifies else -1
