"""What confining a child means on Linux: the Landlock and seccomp walls the SDK's launcher
measures, and ``PR_SET_DUMPABLE`` 0 for the agent (its ``/proc`` files then root's alone)."""

from __future__ import annotations

import ctypes

from oarbank_sdk import sandbox

__all__ = ["LinuxSandboxHost"]

_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


class LinuxSandboxHost:
    # What must hold for a child's only connections to be those the agent hands it.
    endpoint_walls: tuple[str, ...] = ("no_new_privs", "seccomp_listen", "seccomp_socket",
                                       "seccomp_bind_connect")
    required_walls: tuple[str, ...] = (
        "no_new_privs", "seccomp_listen", "seccomp_socket", "seccomp_bind_connect",
        "seccomp_io_uring", "landlock_fs", "landlock_signal", "landlock_abstract_unix",
        "caps_dropped", "seccomp_ptrace", "seccomp_privileged", "devices")
    # netns is belt and braces over the socket refusal: its absence is warned about.
    extra_walls: tuple[str, ...] = ("netns",)

    def unavailable_reason(self) -> str | None:
        if sandbox.available():
            return None
        caps = sandbox.capabilities()
        missing = [n for n in ("no_new_privs", "seccomp_listen", "seccomp_socket")
                   if caps.get(n) != sandbox.ENFORCED]
        return f"unavailable: {', '.join(missing) or 'launcher'}"

    def set_undumpable(self) -> bool:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        return self.undumpable()

    def undumpable(self) -> bool:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)

    def walls(self) -> dict[str, str]:
        return {}  # the SDK's launcher measures them (``sandbox.capabilities``)

    def kernel_note(self) -> str | None:
        return f"Landlock ABI {sandbox.landlock_abi()} on this kernel"
