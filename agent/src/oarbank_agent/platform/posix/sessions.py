"""Plain subprocesses in a session of their own, for tools that run outside the agent's loop
(the demo's agent, the GPU probes): start one, ask it to stop, end its whole session.

A session leader's pid is its process group's id, so ending the session is one ``killpg``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

__all__ = ["PosixSessions"]


class PosixSessions:
    def popen_options(self, *, stop_with_parent: bool = False) -> dict[str, Any]:
        """``subprocess.Popen`` keywords: its own session; ``stop_with_parent``: asked to stop
        when the process that started it dies, where the system can say so (not here)."""
        return {"start_new_session": True}

    def start(self, argv: list[str], *, stop_with_parent: bool = False,
              **popen: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(argv, **popen)`` in its own session (``popen_options``)."""
        return subprocess.Popen(argv, **popen,
                                **self.popen_options(stop_with_parent=stop_with_parent))

    def ask_to_stop(self, proc: subprocess.Popen[Any]) -> None:
        """The polite stop (SIGTERM): a drain, for the agent."""
        proc.send_signal(signal.SIGTERM)

    def kill_session(self, leader_pid: int) -> None:
        """Everything left in the session ``leader_pid`` started; gone already is fine."""
        try:
            os.killpg(leader_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
