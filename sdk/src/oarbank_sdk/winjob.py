"""Windows job objects, bound once (ctypes), for the agent and the conformance kit.

- ``JobObject``: a kill-on-close job object with no breakaway, per op, daemon and runner:
  when its last handle closes (its owner stopped, or was killed: the kernel closes its
  handles) every process in it ends, its children and theirs included, since children are
  born in their parent's job. ``start_in_job`` starts a process suspended, assigns it, then
  resumes it, so not one instruction of it runs outside.
- The job calls under it (``create_job``, ``set_limits``, ``assign``, ``is_in_job``,
  ``job_pids``, ``terminate_job``) and the process calls they need (``open_process``,
  ``close``, ``resume_process``); the agent's named and limited groups add theirs on the same
  binding (``api``; agent ``platform/windows/jobapi.py``).

State: a ``JobObject`` is open (``handle`` set) until ``close``; ``terminate`` ends its
processes and leaves it open (``pids`` then lists none once they are gone).

Standard library only. It imports everywhere; its calls need Windows (the DLLs load at the
first call). Each wrapper raises ``OSError`` on failure, naming the call.
"""

from __future__ import annotations

import ctypes
import functools
import subprocess
from ctypes import wintypes
from types import SimpleNamespace
from typing import Any

__all__ = [
    "CREATE_SUSPENDED", "EXTENDED_LIMIT_INFORMATION", "JOB_ACCESS",
    "JOB_OBJECT_LIMIT_ACTIVE_PROCESS", "JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION",
    "JOB_OBJECT_LIMIT_JOB_MEMORY", "JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE",
    "PROCESS_QUERY_INFORMATION", "PROCESS_SET_QUOTA", "PROCESS_SUSPEND_RESUME",
    "PROCESS_TERMINATE", "JobObject", "api", "assign", "check", "close", "create_job",
    "is_in_job", "job_pids", "open_process", "resume_process", "set_limits", "sig",
    "start_in_job", "terminate_job",
]

PROCESS_TERMINATE = 0x0001
PROCESS_SET_QUOTA = 0x0100
PROCESS_QUERY_INFORMATION = 0x0400  # Wine's IsProcessInJob wants it (LIMITED is not enough)
PROCESS_SUSPEND_RESUME = 0x0800
CREATE_SUSPENDED = 0x00000004

JOB_ACCESS = 0x1F001F  # JOB_OBJECT_ALL_ACCESS: assign, query, terminate, set limits
JOB_OBJECT_LIMIT_ACTIVE_PROCESS = 0x00000008
JOB_OBJECT_LIMIT_JOB_MEMORY = 0x00000200
JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION = 0x00000400
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000
EXTENDED_LIMIT_INFORMATION = 9
_BASIC_PROCESS_ID_LIST = 3
_MAX_PIDS = 1024

_ct: Any = ctypes  # WinDLL, get_last_error, FormatError: Windows only


class _IoCounters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "ReadOperationCount", "WriteOperationCount", "OtherOperationCount",
        "ReadTransferCount", "WriteTransferCount", "OtherTransferCount")]


class _BasicLimits(ctypes.Structure):
    _fields_ = [("PerProcessUserTimeLimit", wintypes.LARGE_INTEGER),
                ("PerJobUserTimeLimit", wintypes.LARGE_INTEGER),
                ("LimitFlags", wintypes.DWORD),
                ("MinimumWorkingSetSize", ctypes.c_size_t),
                ("MaximumWorkingSetSize", ctypes.c_size_t),
                ("ActiveProcessLimit", wintypes.DWORD),
                ("Affinity", ctypes.c_size_t),
                ("PriorityClass", wintypes.DWORD),
                ("SchedulingClass", wintypes.DWORD)]


class _ExtendedLimits(ctypes.Structure):
    _fields_ = [("BasicLimitInformation", _BasicLimits),
                ("IoInfo", _IoCounters),
                ("ProcessMemoryLimit", ctypes.c_size_t),
                ("JobMemoryLimit", ctypes.c_size_t),
                ("PeakProcessMemoryUsed", ctypes.c_size_t),
                ("PeakJobMemoryUsed", ctypes.c_size_t)]


class _PidList(ctypes.Structure):
    _fields_ = [("NumberOfAssignedProcesses", wintypes.DWORD),
                ("NumberOfProcessIdsInList", wintypes.DWORD),
                ("ProcessIdList", ctypes.c_size_t * _MAX_PIDS)]


def sig(fn: Any, restype: Any, *argtypes: Any) -> Any:
    """``fn`` with its result and argument types set (ctypes)."""
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


@functools.cache
def api() -> SimpleNamespace:
    """The job object calls of kernel32, and the process calls they need."""
    k32 = _ct.WinDLL("kernel32", use_last_error=True)
    ntdll = _ct.WinDLL("ntdll")
    h, dword, boolean = wintypes.HANDLE, wintypes.DWORD, wintypes.BOOL
    return SimpleNamespace(
        CreateJobObjectW=sig(k32.CreateJobObjectW, h, ctypes.c_void_p, wintypes.LPCWSTR),
        OpenJobObjectW=sig(k32.OpenJobObjectW, h, dword, boolean, wintypes.LPCWSTR),
        SetInformationJobObject=sig(k32.SetInformationJobObject, boolean, h, ctypes.c_int,
                                    ctypes.c_void_p, dword),
        QueryInformationJobObject=sig(k32.QueryInformationJobObject, boolean, h, ctypes.c_int,
                                      ctypes.c_void_p, dword, ctypes.POINTER(dword)),
        AssignProcessToJobObject=sig(k32.AssignProcessToJobObject, boolean, h, h),
        IsProcessInJob=sig(k32.IsProcessInJob, boolean, h, h, ctypes.POINTER(boolean)),
        TerminateJobObject=sig(k32.TerminateJobObject, boolean, h, wintypes.UINT),
        OpenProcess=sig(k32.OpenProcess, h, dword, boolean, dword),
        CloseHandle=sig(k32.CloseHandle, boolean, h),
        NtResumeProcess=sig(ntdll.NtResumeProcess, ctypes.c_long, h),
    )


def check(ok: object, call: str) -> None:
    """OSError naming ``call`` and the last error, when ``ok`` is false."""
    if not ok:
        err = _ct.get_last_error()
        raise OSError(None, f"{call}: {_ct.FormatError(err)}", None, err)


def create_job() -> int:
    """A new unnamed job object, with no limits yet (``set_limits``)."""
    handle = api().CreateJobObjectW(None, None)
    check(handle, "CreateJobObjectW")
    return int(handle)


def set_limits(job: int, flags: int, *, job_memory: int = 0, active_processes: int = 0) -> None:
    """The job's extended limits: ``flags`` (kill on close, ...), the whole job's committed
    memory (``job_memory`` bytes, 0: none), at most ``active_processes`` (with
    JOB_OBJECT_LIMIT_ACTIVE_PROCESS), breakaway never allowed."""
    info = _ExtendedLimits()
    if job_memory:
        flags |= JOB_OBJECT_LIMIT_JOB_MEMORY
        info.JobMemoryLimit = job_memory
    info.BasicLimitInformation.LimitFlags = flags
    info.BasicLimitInformation.ActiveProcessLimit = active_processes
    check(api().SetInformationJobObject(job, EXTENDED_LIMIT_INFORMATION, ctypes.byref(info),
                                        ctypes.sizeof(info)),
          "SetInformationJobObject(extended limits)")


def assign(job: int, process: int) -> None:
    check(api().AssignProcessToJobObject(job, process), "AssignProcessToJobObject")


def is_in_job(process: int, job: int) -> bool:
    result = wintypes.BOOL()
    check(api().IsProcessInJob(process, job, ctypes.byref(result)), "IsProcessInJob")
    return bool(result.value)


def terminate_job(job: int, exit_code: int) -> None:
    check(api().TerminateJobObject(job, exit_code), "TerminateJobObject")


def job_pids(job: int) -> list[int]:
    info = _PidList()
    check(api().QueryInformationJobObject(job, _BASIC_PROCESS_ID_LIST, ctypes.byref(info),
                                          ctypes.sizeof(info), None),
          "QueryInformationJobObject")
    return [int(info.ProcessIdList[i]) for i in range(info.NumberOfProcessIdsInList)]


def open_process(pid: int, access: int) -> int:
    handle = api().OpenProcess(access, False, pid)
    check(handle, f"OpenProcess({pid})")
    return int(handle)


def close(handle: int) -> None:
    api().CloseHandle(handle)


def resume_process(process: int) -> None:
    status = api().NtResumeProcess(process)
    if status != 0:
        raise OSError(None, f"NtResumeProcess: NTSTATUS {status & 0xFFFFFFFF:#x}")


class JobObject:
    """One kill-on-close job object (owned: ``close`` ends what is still in it)."""

    def __init__(self, *, max_processes: int = 0) -> None:
        self.handle: int | None = create_job()
        flags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION
        if max_processes:
            flags |= JOB_OBJECT_LIMIT_ACTIVE_PROCESS
        try:
            set_limits(self.handle, flags, active_processes=max_processes)
        except BaseException:
            self.close()
            raise

    @classmethod
    def of_handle(cls, handle: int) -> JobObject:
        """A job object made (named, limited: the agent's ``groups.py``) or opened elsewhere;
        ours to close from now on."""
        job = cls.__new__(cls)
        job.handle = handle
        return job

    def _live(self) -> int:
        if self.handle is None:
            raise ValueError("the job object is closed")
        return self.handle

    def assign(self, process: int) -> None:
        assign(self._live(), process)

    def contains(self, pid: int) -> bool:
        """Whether process ``pid`` runs in this job object (False for a pid that is gone)."""
        try:
            process = open_process(pid, PROCESS_QUERY_INFORMATION)
        except OSError:
            return False
        try:
            return is_in_job(process, self._live())
        finally:
            close(process)

    def pids(self) -> list[int]:
        return [] if self.handle is None else job_pids(self.handle)

    def terminate(self, exit_code: int = 1) -> None:
        terminate_job(self._live(), exit_code)

    def close(self) -> None:
        """Close our handle: kill-on-close ends every process still in it. Idempotent."""
        handle, self.handle = self.handle, None
        if handle is not None:
            close(handle)

    def __enter__(self) -> JobObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_in_job(argv: list[str], job: JobObject, **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **popen)`` started suspended, put in ``job``, then resumed.
    A process that cannot be assigned is ended before it runs, and the error raised."""
    flags = popen.pop("creationflags", 0) | CREATE_SUSPENDED
    proc = subprocess.Popen(argv, creationflags=flags, **popen)
    try:
        process = open_process(proc.pid, PROCESS_SET_QUOTA | PROCESS_TERMINATE
                               | PROCESS_SUSPEND_RESUME)
        try:
            job.assign(process)
            resume_process(process)
        finally:
            close(process)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc
