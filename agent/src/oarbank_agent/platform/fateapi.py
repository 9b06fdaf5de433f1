"""The platform interface's part for fate sharing: a job's runner does not outlive the agent.

POSIX: a watcher sees the agent's end (EOF on a pipe only the agent writes) and kills every
recorded runner group at once (``posix/tether.py``, ``posix/tetherwatch.py``). Windows: none
is needed (``Backend.tether`` is None): each group is a kill-on-close job object whose only
handle is the agent's, so the system ends a runner's job when the agent dies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["Tether", "TetherHost"]


class Tether(Protocol):
    """The agent's side of its watcher."""

    @property
    def pid(self) -> int:
        """The watcher's pid (for the log)."""

    def close(self) -> None:
        """A clean stop, every runner ended already: the watcher may go (it exits)."""

    def exited(self) -> bool:
        """Whether the watcher has exited (and is reaped)."""

    def kill(self) -> None:
        """End the watcher now (it did not exit after ``close``)."""


class TetherHost(Protocol):
    def start(self, state_dir: Path) -> Tether:
        """From now on, when this process ends (however: SIGKILL included), every runner group
        recorded under ``state_dir/procs`` is killed at once. Raises OSError."""
