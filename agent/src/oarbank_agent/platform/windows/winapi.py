"""kernel32 and ntdll calls the Windows backend makes that ``_winapi`` lacks (ctypes).

Each wrapper raises ``OSError`` on failure, naming the call. The module imports on every
system (the agent's tests import all its modules); the DLLs load at the first call, which only
Windows can make. Windows-only parts of ``ctypes`` are reached as ``Any`` for that reason.
"""

from __future__ import annotations

import ctypes
import functools
from ctypes import wintypes
from types import SimpleNamespace
from typing import Any

__all__ = [
    "PROCESS_DUP_HANDLE", "PROCESS_QUERY_INFORMATION", "PROCESS_SET_QUOTA", "PROCESS_TERMINATE",
    "PROCESS_SUSPEND_RESUME", "CREATE_SUSPENDED", "create_job", "set_job_limits", "assign",
    "is_in_job", "terminate_job", "job_pids", "resume_process", "open_process", "close",
    "pipe_client_pid", "lock_file", "long_paths", "terminate_process",
    "send_ctrl_break", "has_console",
]

PROCESS_TERMINATE = 0x0001
PROCESS_DUP_HANDLE = 0x0040
PROCESS_SET_QUOTA = 0x0100
PROCESS_QUERY_INFORMATION = 0x0400  # Wine's IsProcessInJob wants it (LIMITED is not enough)
PROCESS_SUSPEND_RESUME = 0x0800
CREATE_SUSPENDED = 0x00000004

JOB_OBJECT_LIMIT_ACTIVE_PROCESS = 0x00000008
JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION = 0x00000400
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000
_BASIC_PROCESS_ID_LIST = 3
_EXTENDED_LIMIT_INFORMATION = 9
_MAX_PIDS = 1024

_LOCKFILE_FAIL_IMMEDIATELY = 0x1
_LOCKFILE_EXCLUSIVE_LOCK = 0x2
_ERROR_LOCK_VIOLATION = 33
_CTRL_BREAK_EVENT = 1

_ct: Any = ctypes  # WinDLL, get_last_error, FormatError: Windows only


class _Overlapped(ctypes.Structure):
    _fields_ = [("Internal", ctypes.c_size_t), ("InternalHigh", ctypes.c_size_t),
                ("Offset", wintypes.DWORD), ("OffsetHigh", wintypes.DWORD),
                ("hEvent", wintypes.HANDLE)]


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


def _sig(fn: Any, restype: Any, *argtypes: Any) -> Any:
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


@functools.cache
def _api() -> SimpleNamespace:
    k32 = _ct.WinDLL("kernel32", use_last_error=True)
    ntdll = _ct.WinDLL("ntdll")
    h, dword, boolean = wintypes.HANDLE, wintypes.DWORD, wintypes.BOOL
    return SimpleNamespace(
        CreateJobObjectW=_sig(k32.CreateJobObjectW, h, ctypes.c_void_p, wintypes.LPCWSTR),
        SetInformationJobObject=_sig(k32.SetInformationJobObject, boolean, h, ctypes.c_int,
                                     ctypes.c_void_p, dword),
        QueryInformationJobObject=_sig(k32.QueryInformationJobObject, boolean, h, ctypes.c_int,
                                       ctypes.c_void_p, dword, ctypes.POINTER(dword)),
        AssignProcessToJobObject=_sig(k32.AssignProcessToJobObject, boolean, h, h),
        IsProcessInJob=_sig(k32.IsProcessInJob, boolean, h, h, ctypes.POINTER(boolean)),
        TerminateJobObject=_sig(k32.TerminateJobObject, boolean, h, wintypes.UINT),
        TerminateProcess=_sig(k32.TerminateProcess, boolean, h, wintypes.UINT),
        GenerateConsoleCtrlEvent=_sig(k32.GenerateConsoleCtrlEvent, boolean, dword, dword),
        GetConsoleCP=_sig(k32.GetConsoleCP, wintypes.UINT),
        OpenProcess=_sig(k32.OpenProcess, h, dword, boolean, dword),
        CloseHandle=_sig(k32.CloseHandle, boolean, h),
        GetNamedPipeClientProcessId=_sig(k32.GetNamedPipeClientProcessId, boolean, h,
                                         ctypes.POINTER(wintypes.ULONG)),
        NtResumeProcess=_sig(ntdll.NtResumeProcess, ctypes.c_long, h),
        LockFileEx=_sig(k32.LockFileEx, boolean, h, dword, dword, dword, dword,
                        ctypes.POINTER(_Overlapped)),
        RtlAreLongPathsEnabled=getattr(ntdll, "RtlAreLongPathsEnabled", None),
    )


def _check(ok: object, call: str) -> None:
    if not ok:
        err = _ct.get_last_error()
        raise OSError(None, f"{call}: {_ct.FormatError(err)}", None, err)


def create_job() -> int:
    handle = _api().CreateJobObjectW(None, None)
    _check(handle, "CreateJobObjectW")
    return int(handle)


def set_job_limits(job: int, flags: int, active_processes: int = 0) -> None:
    """Set the job's basic limit flags (kill on close, ...), breakaway never allowed."""
    info = _ExtendedLimits()
    info.BasicLimitInformation.LimitFlags = flags
    info.BasicLimitInformation.ActiveProcessLimit = active_processes
    _check(_api().SetInformationJobObject(job, _EXTENDED_LIMIT_INFORMATION, ctypes.byref(info),
                                    ctypes.sizeof(info)), "SetInformationJobObject")


def assign(job: int, process: int) -> None:
    _check(_api().AssignProcessToJobObject(job, process), "AssignProcessToJobObject")


def is_in_job(process: int, job: int) -> bool:
    result = wintypes.BOOL()
    _check(_api().IsProcessInJob(process, job, ctypes.byref(result)), "IsProcessInJob")
    return bool(result.value)


def terminate_job(job: int, exit_code: int) -> None:
    _check(_api().TerminateJobObject(job, exit_code), "TerminateJobObject")


def job_pids(job: int) -> list[int]:
    info = _PidList()
    _check(_api().QueryInformationJobObject(job, _BASIC_PROCESS_ID_LIST, ctypes.byref(info),
                                      ctypes.sizeof(info), None), "QueryInformationJobObject")
    return [int(info.ProcessIdList[i]) for i in range(info.NumberOfProcessIdsInList)]


def terminate_process(process: int, exit_code: int) -> None:
    _check(_api().TerminateProcess(process, exit_code), "TerminateProcess")


def send_ctrl_break(group: int) -> None:
    """Ctrl-Break to the console process group ``group`` (its leader's pid); OSError where
    it shares no console with us."""
    _check(_api().GenerateConsoleCtrlEvent(_CTRL_BREAK_EVENT, group),
           f"GenerateConsoleCtrlEvent({group})")


def has_console() -> bool:
    """Whether this process is attached to a console (Ctrl-C/Ctrl-Break can reach it)."""
    return bool(_api().GetConsoleCP())


def open_process(pid: int, access: int) -> int:
    handle = _api().OpenProcess(access, False, pid)
    _check(handle, f"OpenProcess({pid})")
    return int(handle)


def close(handle: int) -> None:
    _api().CloseHandle(handle)


def resume_process(process: int) -> None:
    status = _api().NtResumeProcess(process)
    if status != 0:
        raise OSError(None, f"NtResumeProcess: NTSTATUS {status & 0xFFFFFFFF:#x}")


def pipe_client_pid(server_end: int) -> int:
    pid = wintypes.ULONG()
    _check(_api().GetNamedPipeClientProcessId(server_end, ctypes.byref(pid)),
           "GetNamedPipeClientProcessId")
    return int(pid.value)


def lock_file(file: int, offset: int) -> bool:
    """An exclusive lock on the byte at ``offset`` of the open file ``file`` (a handle), not
    waited for: True if taken, False if another handle holds it."""
    ov = _Overlapped()
    ov.Offset, ov.OffsetHigh = offset & 0xFFFFFFFF, offset >> 32
    if _api().LockFileEx(file, _LOCKFILE_EXCLUSIVE_LOCK | _LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0,
                         ctypes.byref(ov)):
        return True
    err = _ct.get_last_error()
    if err == _ERROR_LOCK_VIOLATION:
        return False
    raise OSError(None, f"LockFileEx: {_ct.FormatError(err)}", None, err)


def long_paths() -> bool:
    """Whether paths over MAX_PATH work for this process (LongPathsEnabled, and our manifest
    says longPathAware: CPython's does)."""
    fn = _api().RtlAreLongPathsEnabled
    if fn is None:
        return False
    fn.restype, fn.argtypes = ctypes.c_ubyte, []
    return bool(fn())
