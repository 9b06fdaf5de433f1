"""The factory's own confinement: as tight as its children's start-up allows.

When the sandbox confines every child (``--confine``): not dumpable (``PR_SET_DUMPABLE`` 0:
its /proc files are root's alone, nobody can ptrace it without capabilities), like the agent
then; no_new_privs, and of root's capabilities only those a child needs before it
confines itself (a new network namespace: CAP_SYS_ADMIN; emptying its bounding set:
CAP_SETPCAP; its folders and its group's join file whatever their modes: the DAC ones). Everything
else (raw sockets, module loading, mounts through another path, ...) is gone from the factory
and, through it, from every child's start. Without the sandbox the children get the agent's
privileges unchanged (the direct path's), so the factory keeps them too.

No seccomp filter of its own: it would stack under each child's (a child's ``Seccomp_filters``
would read 2 instead of the launcher's 1), and an EPERM rule in it would win over the child
filter's user notification, so the agent could no longer count refused network attempts.
"""

from __future__ import annotations

import ctypes
import os
import sys

from oarbank_sdk import sandbox

__all__ = ["undumpable", "confine", "KEPT_CAPS"]

_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_CAP_V3 = 0x20080522
# CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_SETPCAP, CAP_SYS_ADMIN
KEPT_CAPS = (1, 2, 3, 8, 21)


def undumpable() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _held() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapPrm:"):
                return int(line.split()[1], 16)
    return 0


def confine() -> None:
    """Raises OSError when a step the kernel should allow is refused."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    undumpable()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if os.getuid() != 0:
        return  # nothing held to drop
    for cap in range(sandbox.last_capability() + 1):
        if cap not in KEPT_CAPS:
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: harmless
    mask = sum(1 << c for c in KEPT_CAPS) & _held()  # never ask for one not held
    header = (ctypes.c_uint32 * 2)(_CAP_V3, 0)
    data = (ctypes.c_uint32 * 6)(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0, mask >> 32,
                                 mask >> 32, 0)
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset() to the kept capabilities failed")
