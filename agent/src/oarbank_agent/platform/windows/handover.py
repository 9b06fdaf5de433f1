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

from dataclasses import dataclass
from typing import Any

from oarbank_sdk.protocol import close_in, current_transport, duplicate_into
from oarbank_sdk.winjob import JobObject

__all__ = ["BadPid", "Handover", "hand_over", "duplicate_pair", "DuplicatingHandovers"]


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
