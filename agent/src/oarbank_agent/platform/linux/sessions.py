"""Sessions on Linux: as POSIX, plus ``PR_SET_PDEATHSIG``, so a child started with
``stop_with_parent`` gets SIGTERM when the process that started it dies (a demo or a test
killed from outside leaves no agent behind)."""

from __future__ import annotations

import ctypes
import signal
from typing import Any

from oarbank_agent.platform.posix.sessions import PosixSessions

__all__ = ["LinuxSessions"]

_PR_SET_PDEATHSIG = 1


def _stop_with_parent() -> None:
    """In the child, before exec."""
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class LinuxSessions(PosixSessions):
    def popen_options(self, *, stop_with_parent: bool = False) -> dict[str, Any]:
        options = super().popen_options()
        if stop_with_parent:
            options["preexec_fn"] = _stop_with_parent
        return options
