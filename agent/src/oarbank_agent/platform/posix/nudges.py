"""Nudges on POSIX (runner protocol, Control): SIGUSR1 to the runner process alone.

The agent ignores SIGUSR1 itself, so every child it starts inherits it ignored (the direct
path by exec; the process factory asks the agent's ignored signals at each spawn). A runner
that handles nudges installs its handler first and reads the document then; one that does not
never dies of a nudge.
"""

from __future__ import annotations

import os
import signal

__all__ = ["SignalNudges"]


class _SignalNudge:
    """A runner's nudge: nothing to pass it, nothing to close."""

    env: dict[str, str] = {}
    inherit: tuple[int, ...] = ()

    def spawned(self) -> None:
        pass

    def nudge(self, leader: int) -> bool:
        try:
            os.kill(leader, signal.SIGUSR1)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        pass


class SignalNudges:
    how = "SIGUSR1"

    def prepare(self) -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    def for_runner(self) -> _SignalNudge:
        return _SignalNudge()
