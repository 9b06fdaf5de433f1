"""What confining a child means on Windows, wall by wall: what job objects enforce (UI
restrictions, a process count) is measured; the walls that would keep a child off the network
(an AppContainer, a restricted token) have no launcher yet, so the sandbox is unavailable and
``--sandbox required`` refuses, naming each wall.

Under Wine there is no AppContainer and no restricted token at all (said as such); on Windows
the system has both, the SDK's launcher does not use them yet. The agent cannot be made
undumpable: a process of the same user may always read its memory on Windows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from oarbank_agent.platform.windows import jobapi, winapi
from oarbank_sdk import winjob

__all__ = ["WindowsSandboxHost", "ENFORCED"]

ENFORCED = "enforced"
NO_LAUNCHER = "the SDK's launcher has no Windows wall yet"


def _job_wall(set_it: Callable[[int], None]) -> str:
    """``enforced`` if a throwaway job takes the limit, else why not."""
    try:
        handle = winjob.create_job()
    except OSError as exc:
        return f"no job object: {exc}"
    try:
        set_it(handle)
        return ENFORCED
    except OSError as exc:
        return str(exc)
    finally:
        winapi.close(handle)


def _process_limit(job: int) -> None:
    winjob.set_limits(job, winjob.JOB_OBJECT_LIMIT_ACTIVE_PROCESS, active_processes=64)


@functools.cache
def _measure() -> dict[str, str]:
    absent = ("not available under Wine" if jobapi.is_wine()
              else f"offered by Windows, unused: {NO_LAUNCHER}")
    return {"job_ui_limits": _job_wall(jobapi.set_ui_limits),
            "job_process_limit": _job_wall(_process_limit),
            "windows_appcontainer": absent,
            "windows_restricted_token": absent}


class WindowsSandboxHost:
    # An AppContainer without network capabilities is what would leave a child no connection
    # but the agent's (loopback included).
    endpoint_walls: tuple[str, ...] = ("windows_appcontainer",)
    required_walls: tuple[str, ...] = ("windows_appcontainer", "job_ui_limits",
                                       "job_process_limit")
    extra_walls: tuple[str, ...] = ("windows_restricted_token",)

    def walls(self) -> dict[str, str]:
        """Each wall: ``enforced``, or why it is not (measured once per process)."""
        return dict(_measure())

    def unavailable_reason(self) -> str | None:
        walls = self.walls()
        missing = [f"{n} ({walls[n]})" for n in (*self.required_walls, *self.extra_walls)
                   if walls[n] != ENFORCED]
        held = [n for n, state in walls.items() if state == ENFORCED]
        return (f"{NO_LAUNCHER}; unavailable: {', '.join(missing) or 'none'}; job objects "
                f"enforce: {', '.join(held) or 'nothing'} (no network wall among them)")

    def set_undumpable(self) -> bool:
        return False

    def undumpable(self) -> bool:
        return False

    def kernel_note(self) -> str | None:
        return None
