"""kernel32 and ntdll calls the Windows backend makes that ``_winapi`` lacks (ctypes).

Each wrapper raises ``OSError`` (``ctypes.WinError``) on failure, naming the call. Loaded on
Windows only: importing this module elsewhere raises ``ImportError``.
"""

from __future__ import annotations

import ctypes
import sys
from ctypes import wintypes

if sys.platform != "win32":  # pragma: no cover - imported only by the Windows backend
    raise ImportError("oarbank_agent.platform.windows.winapi is Windows only")

__all__ = [
    "PROCESS_DUP_HANDLE", "PROCESS_QUERY_INFORMATION", "PROCESS_SET_QUOTA", "PROCESS_TERMINATE",
    "PROCESS_SUSPEND_RESUME", "CREATE_SUSPENDED", "create_job", "set_job_limits", "assign",
    "is_in_job", "terminate_job", "job_pids", "resume_process", "open_process", "close",
    "pipe_client_pid",
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

_k32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
_ntdll = ctypes.WinDLL("ntdll")  # type: ignore[attr-defined]


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


def _sig(fn, restype, *argtypes):  # type: ignore[no-untyped-def]
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


_CreateJobObjectW = _sig(_k32.CreateJobObjectW, wintypes.HANDLE, ctypes.c_void_p,
                         wintypes.LPCWSTR)
_SetInformationJobObject = _sig(_k32.SetInformationJobObject, wintypes.BOOL, wintypes.HANDLE,
                                ctypes.c_int, ctypes.c_void_p, wintypes.DWORD)
_QueryInformationJobObject = _sig(_k32.QueryInformationJobObject, wintypes.BOOL,
                                  wintypes.HANDLE, ctypes.c_int, ctypes.c_void_p,
                                  wintypes.DWORD, ctypes.POINTER(wintypes.DWORD))
_AssignProcessToJobObject = _sig(_k32.AssignProcessToJobObject, wintypes.BOOL,
                                 wintypes.HANDLE, wintypes.HANDLE)
_IsProcessInJob = _sig(_k32.IsProcessInJob, wintypes.BOOL, wintypes.HANDLE, wintypes.HANDLE,
                       ctypes.POINTER(wintypes.BOOL))
_TerminateJobObject = _sig(_k32.TerminateJobObject, wintypes.BOOL, wintypes.HANDLE,
                           wintypes.UINT)
_OpenProcess = _sig(_k32.OpenProcess, wintypes.HANDLE, wintypes.DWORD, wintypes.BOOL,
                    wintypes.DWORD)
_CloseHandle = _sig(_k32.CloseHandle, wintypes.BOOL, wintypes.HANDLE)
_GetNamedPipeClientProcessId = _sig(_k32.GetNamedPipeClientProcessId, wintypes.BOOL,
                                    wintypes.HANDLE, ctypes.POINTER(wintypes.ULONG))
_NtResumeProcess = _sig(_ntdll.NtResumeProcess, ctypes.c_long, wintypes.HANDLE)


def _check(ok: object, call: str) -> None:
    if not ok:
        err = ctypes.get_last_error()
        raise OSError(None, f"{call}: {ctypes.FormatError(err)}", None, err)  # type: ignore[attr-defined]


def create_job() -> int:
    handle = _CreateJobObjectW(None, None)
    _check(handle, "CreateJobObjectW")
    return int(handle)


def set_job_limits(job: int, flags: int, active_processes: int = 0) -> None:
    """Set the job's basic limit flags (kill on close, ...), breakaway never allowed."""
    info = _ExtendedLimits()
    info.BasicLimitInformation.LimitFlags = flags
    info.BasicLimitInformation.ActiveProcessLimit = active_processes
    _check(_SetInformationJobObject(job, _EXTENDED_LIMIT_INFORMATION, ctypes.byref(info),
                                    ctypes.sizeof(info)), "SetInformationJobObject")


def assign(job: int, process: int) -> None:
    _check(_AssignProcessToJobObject(job, process), "AssignProcessToJobObject")


def is_in_job(process: int, job: int) -> bool:
    result = wintypes.BOOL()
    _check(_IsProcessInJob(process, job, ctypes.byref(result)), "IsProcessInJob")
    return bool(result.value)


def terminate_job(job: int, exit_code: int) -> None:
    _check(_TerminateJobObject(job, exit_code), "TerminateJobObject")


def job_pids(job: int) -> list[int]:
    info = _PidList()
    _check(_QueryInformationJobObject(job, _BASIC_PROCESS_ID_LIST, ctypes.byref(info),
                                      ctypes.sizeof(info), None), "QueryInformationJobObject")
    return [int(info.ProcessIdList[i]) for i in range(info.NumberOfProcessIdsInList)]


def open_process(pid: int, access: int) -> int:
    handle = _OpenProcess(access, False, pid)
    _check(handle, f"OpenProcess({pid})")
    return int(handle)


def close(handle: int) -> None:
    _CloseHandle(handle)


def resume_process(process: int) -> None:
    status = _NtResumeProcess(process)
    if status != 0:
        raise OSError(None, f"NtResumeProcess: NTSTATUS {status & 0xFFFFFFFF:#x}")


def pipe_client_pid(server_end: int) -> int:
    pid = wintypes.ULONG()
    _check(_GetNamedPipeClientProcessId(server_end, ctypes.byref(pid)),
           "GetNamedPipeClientProcessId")
    return int(pid.value)
