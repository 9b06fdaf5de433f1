"""The platform interface's parts for the agent's hold on its runners: fate sharing (a job's
runner does not outlive the agent) and nudges (a runner told its control document changed).

Fate sharing. POSIX: a watcher sees the agent's end (EOF on a pipe only the agent writes) and
kills every recorded runner group at once (``posix/tether.py``, ``posix/tetherwatch.py``).
Windows: none is needed (``Backend.tether`` is None): each group is a kill-on-close job object
whose only handle is the agent's, so the system ends a runner's job when the agent dies.

Nudges (runner protocol, Control), one ``RunnerNudge`` per attempt, made before its runner
starts. POSIX (``posix/nudges.py``): SIGUSR1 to the runner process, never to its children;
every child of the agent starts with SIGUSR1 ignored, so a nudge that comes before the runner
installed its handler is lost harmlessly. Windows (``windows/nudges.py``): an auto-reset event
the runner inherits, its handle in ``OARBANK_CONTROL_EVENT``; set after each change, the
runner's wait on it resets it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["Nudges", "RunnerNudge", "Tether", "TetherHost"]


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


class RunnerNudge(Protocol):
    """How one attempt's runner is nudged. ``env`` and ``inherit`` go to its spawn (what its
    environment gains, the handles it inherits); ``spawned`` once it runs (the agent's copies
    meant for the child are closed); ``close`` when the attempt is over."""

    env: dict[str, str]
    inherit: tuple[int, ...]

    def spawned(self) -> None: ...

    def nudge(self, leader: int) -> bool:
        """Tell the runner led by ``leader`` (that process only) its document changed; False
        when it is gone."""

    def close(self) -> None: ...


class Nudges(Protocol):
    how: str  # for the log: what a nudge is here

    def prepare(self) -> None:
        """At the agent's start, before any child: every child starts with nudges ignored."""

    def for_runner(self) -> RunnerNudge:
        """Before an attempt's runner starts. Raises OSError."""
