"""Process groups on Windows: a job object per op, daemon and runner.

Every job object is made kill-on-close with no breakaway: when its last handle closes (the
agent stopped, or was killed: the kernel closes its handles) every process in it ends, its
children and theirs included, since children are born in their parent's job. A process is
started suspended, assigned, then resumed, so not one instruction of it runs outside.

State: a ``JobObject`` is open (``handle`` set) until ``close``; ``terminate`` ends its
processes and leaves it open (``pids`` then lists none once they are gone).
"""

from __future__ import annotations

import subprocess
from typing import Any

from oarbank_agent.platform.windows import winapi

__all__ = ["JobObject", "start_in_job"]


class JobObject:
    """One kill-on-close job object (owned: ``close`` ends what is still in it)."""

    def __init__(self, *, max_processes: int = 0) -> None:
        self.handle: int | None = winapi.create_job()
        flags = (winapi.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
                 | winapi.JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION)
        if max_processes:
            flags |= winapi.JOB_OBJECT_LIMIT_ACTIVE_PROCESS
        try:
            winapi.set_job_limits(self.handle, flags, max_processes)
        except BaseException:
            self.close()
            raise

    @classmethod
    def of_handle(cls, handle: int) -> JobObject:
        """A job object made (named, limited: ``groups.py``) or opened elsewhere; ours to
        close from now on."""
        job = cls.__new__(cls)
        job.handle = handle
        return job

    def _live(self) -> int:
        if self.handle is None:
            raise ValueError("the job object is closed")
        return self.handle

    def assign(self, process: int) -> None:
        winapi.assign(self._live(), process)

    def contains(self, pid: int) -> bool:
        """Whether process ``pid`` runs in this job object (False for a pid that is gone)."""
        try:
            process = winapi.open_process(pid, winapi.PROCESS_QUERY_INFORMATION)
        except OSError:
            return False
        try:
            return winapi.is_in_job(process, self._live())
        finally:
            winapi.close(process)

    def pids(self) -> list[int]:
        return winapi.job_pids(self._live())

    def terminate(self, exit_code: int = 1) -> None:
        winapi.terminate_job(self._live(), exit_code)

    def close(self) -> None:
        """Close our handle: kill-on-close ends every process still in it. Idempotent."""
        handle, self.handle = self.handle, None
        if handle is not None:
            winapi.close(handle)

    def __enter__(self) -> JobObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_in_job(argv: list[str], job: JobObject, **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **popen)`` started suspended, put in ``job``, then resumed.
    A process that cannot be assigned is ended before it runs, and the error raised."""
    flags = popen.pop("creationflags", 0) | winapi.CREATE_SUSPENDED
    proc = subprocess.Popen(argv, creationflags=flags, **popen)
    access = (winapi.PROCESS_SET_QUOTA | winapi.PROCESS_TERMINATE
              | winapi.PROCESS_SUSPEND_RESUME)
    try:
        process = winapi.open_process(proc.pid, access)
        try:
            job.assign(process)
            winapi.resume_process(process)
        finally:
            winapi.close(process)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc
