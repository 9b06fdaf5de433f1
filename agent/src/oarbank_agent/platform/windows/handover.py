"""One connection on Windows: a pipe pair, one end duplicated into the service's daemon and
the other into the job process the connect named, once that pid is known to be in the
attempt's job object (else ``bad_pid``).

The pair is the SDK transport's (``current_transport().pair()``): a duplex pipe nobody can
open by name (random name, first and only instance, remote clients refused, opened at once
and its client checked to be us). Duplication order: the service's end first, then the job's; if the job's
fails, the service's copy is closed in the service again, so a refused or failed handover
leaves no handle behind anywhere. The agent keeps its own two ends until the receipts
(``received``, ``accepted``) arrive, as on POSIX: ``Handover.close_ours``.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

from oarbank_agent.platform.windows import winapi
from oarbank_agent.platform.windows.jobobjects import JobObject
from oarbank_sdk.protocol import current_transport

__all__ = ["BadPid", "Handover", "hand_over", "duplicate_pair", "DuplicatingHandovers",
           "duplicate_into", "close_in"]

# Windows only; reached as Any so that this module imports (and type-checks) everywhere.
_winapi: Any = importlib.import_module("_winapi") if sys.platform == "win32" else None
_DUPLICATE_CLOSE_SOURCE = 0x1
_DUPLICATE_SAME_ACCESS = 0x2


class BadPid(Exception):
    """The connect's pid is not a process of the attempt (the refusal code ``bad_pid``)."""

    code = "bad_pid"


@dataclass
class Handover:
    job_handle: int  # a handle value in the job's process: the connector's "handle"
    service_handle: int  # a handle value in the service's daemon: the channel's "handle"
    ours: tuple[Any, Any]  # the agent's two pipe streams (oarbank_sdk's, socket-shaped)

    def close_ours(self) -> None:
        for end in self.ours:
            end.close()


def duplicate_into(pid: int, handle: int) -> int:
    """A copy of our ``handle`` in process ``pid`` (not inheritable there); its value."""
    target = winapi.open_process(pid, winapi.PROCESS_DUP_HANDLE)
    try:
        return _winapi.DuplicateHandle(_winapi.GetCurrentProcess(), handle, target, 0, False,
                                       _DUPLICATE_SAME_ACCESS)
    finally:
        winapi.close(target)


def close_in(pid: int, handle: int) -> None:
    """Close ``handle`` inside process ``pid`` (a copy we put there and nobody was told of)."""
    try:
        target = winapi.open_process(pid, winapi.PROCESS_DUP_HANDLE)
    except OSError:
        return  # gone: its handles went with it
    try:
        dup = _winapi.DuplicateHandle(target, handle, _winapi.GetCurrentProcess(), 0, False,
                                      _DUPLICATE_CLOSE_SOURCE | _DUPLICATE_SAME_ACCESS)
        _winapi.CloseHandle(dup)
    except OSError:
        pass
    finally:
        winapi.close(target)


def hand_over(connect_pid: int, attempt: JobObject, service_pid: int) -> Handover:
    """A fresh connection between the job process ``connect_pid`` and the service's daemon.
    Raises ``BadPid`` when ``connect_pid`` is not in ``attempt``, ``OSError`` when a
    duplication fails (a process gone meanwhile)."""
    if not attempt.contains(connect_pid):
        raise BadPid(f"pid {connect_pid} is not a process of this attempt")
    return duplicate_pair(connect_pid, service_pid)


class DuplicatingHandovers:
    """``api.Handovers`` on Windows: the broker checks both pids (the attempt's and the
    service's groups), this makes the pair and duplicates its ends."""

    def duplicate(self, job_pid: int, service_pid: int) -> tuple[Any, Any, int, int]:
        made = duplicate_pair(job_pid, service_pid)
        return made.ours[0], made.ours[1], made.job_handle, made.service_handle


def duplicate_pair(connect_pid: int, service_pid: int) -> Handover:
    """A new pipe pair, the service's end duplicated into ``service_pid`` and the job's into
    ``connect_pid``. Raises ``OSError`` when a duplication fails; nothing is left behind."""
    job_end, service_end = current_transport().pair()  # Windows: a duplex pipe pair
    try:
        service_handle = duplicate_into(service_pid, service_end.fileno())
        try:
            job_handle = duplicate_into(connect_pid, job_end.fileno())
        except BaseException:
            close_in(service_pid, service_handle)
            raise
    except BaseException:
        job_end.close()
        service_end.close()
        raise
    return Handover(job_handle, service_handle, (job_end, service_end))
