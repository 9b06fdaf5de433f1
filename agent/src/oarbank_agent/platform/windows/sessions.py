"""Plain subprocesses in a session of their own on Windows, for tools outside the agent's
loop: a new process group (Ctrl-Break reaches it alone, the starter's Ctrl-C does not) inside
a job object of its own, so that ending the session ends every process it started.

A session is started suspended, put in its job, then resumed (``oarbank_sdk.winjob.start_in_job``):
nothing of it runs outside. ``stop_with_parent``: the job is kill-on-close, so when the
starter dies (its handles closed by the kernel) the session is ended: killed, not asked,
since Windows has no death signal to ask with. Without it the job outlives the starter (the
keeper of ``--keep-services`` must). ``subprocess.Popen`` with ``popen_options`` alone gives
the process group but no job (Popen has no moment between creating and resuming a process):
``start``, which the agent's callers use, is what puts a session in its job; ``kill_session``
of a leader started without it ends that process only.
"""

from __future__ import annotations

import subprocess
import threading
from typing import Any

from oarbank_agent.platform.windows import winapi
from oarbank_sdk import winjob
from oarbank_sdk.winjob import JobObject, start_in_job

__all__ = ["WindowsSessions", "CREATE_NEW_PROCESS_GROUP"]

CREATE_NEW_PROCESS_GROUP = 0x00000200


class WindowsSessions:
    """``api.Sessions`` on Windows (see the module docstring)."""

    def __init__(self) -> None:
        self._jobs: dict[int, JobObject] = {}  # leader pid -> its session's job
        self._lock = threading.Lock()

    def popen_options(self, *, stop_with_parent: bool = False) -> dict[str, Any]:
        """``subprocess.Popen`` keywords: a new process group (no job: see ``start``)."""
        return {"creationflags": CREATE_NEW_PROCESS_GROUP}

    def start(self, argv: list[str], *, stop_with_parent: bool = False,
              **popen: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(argv, **popen)`` in a new process group inside a job of its
        own; ``stop_with_parent``: ended when the starter dies."""
        self._prune()
        job = JobObject()  # kill-on-close, no breakaway
        try:
            if not stop_with_parent:  # the same job without kill-on-close
                assert job.handle is not None
                winjob.set_limits(job.handle, winjob.JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION)
            flags = popen.pop("creationflags", 0) | CREATE_NEW_PROCESS_GROUP
            proc = start_in_job(argv, job, creationflags=flags, **popen)
        except BaseException:
            job.close()
            raise
        with self._lock:
            self._jobs[proc.pid] = job
        return proc

    def _prune(self) -> None:
        """Let go of the jobs of sessions that ended by themselves (no kill_session came)."""
        with self._lock:
            done = [pid for pid, job in self._jobs.items() if not job.pids()]
            for pid in done:
                self._jobs.pop(pid).close()

    def ask_to_stop(self, proc: subprocess.Popen[Any]) -> None:
        """Ctrl-Break to its process group (a drain, for the agent). Where it shares no
        console with us, nothing polite can reach it: its session is ended instead."""
        if proc.poll() is not None:
            return
        try:
            winapi.send_ctrl_break(proc.pid)  # os.kill's CTRL_BREAK_EVENT raises SystemError
        except OSError:
            self.kill_session(proc.pid)

    def kill_session(self, leader_pid: int) -> None:
        """Everything left in its job (the leader alone if ``start`` did not start it);
        gone already is fine."""
        with self._lock:
            job = self._jobs.pop(leader_pid, None)
        if job is not None:
            try:
                job.terminate(1)
            except OSError:
                pass
            finally:
                job.close()
            return
        try:
            process = winapi.open_process(leader_pid, winapi.PROCESS_TERMINATE)
        except OSError:
            return  # gone (or never ours)
        try:
            winapi.terminate_process(process, 1)
        except OSError:
            pass  # it ended meanwhile
        finally:
            winapi.close(process)
