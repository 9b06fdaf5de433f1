"""Job object calls the process groups make beyond the SDK's (``oarbank_sdk.winjob``: create,
limit, assign, query): names, CPU rate and UI limits, counts, a completion port, Ctrl-Break
(ctypes), on the SDK's binding of the job calls.

Each wrapper raises ``OSError`` on failure, naming the call; the DLLs load at the first call
(the module imports on every system, as ``winapi.py`` does).
"""

from __future__ import annotations

import ctypes
import functools
from ctypes import wintypes
from types import SimpleNamespace
from typing import Any

from oarbank_agent.platform.windows import winapi
from oarbank_sdk import winjob
from oarbank_sdk.winjob import JOB_ACCESS
from oarbank_sdk.winjob import check as _check

__all__ = [
    "CURRENT_PROCESS", "MSG_ACTIVE_PROCESS_ZERO", "MSG_MEMORY_LIMITS", "create_named_job",
    "open_named_job", "set_cpu_rate", "set_ui_limits", "active_processes",
    "new_port", "watch_job", "next_message", "post_quit", "ctrl_break", "wait_process",
    "is_wine",
]

CURRENT_PROCESS = -1  # GetCurrentProcess()'s pseudo handle: every access to this process
ERROR_ALREADY_EXISTS = 183
_BASIC_ACCOUNTING = 1
_BASIC_UI_RESTRICTIONS = 4
_ASSOCIATE_COMPLETION_PORT = 7
_CPU_RATE_CONTROL = 15
CPU_RATE_ENABLE, CPU_RATE_HARD_CAP = 0x1, 0x4
UI_LIMIT_ALL = 0xFF  # desktop, display settings, exit Windows, global atoms, handles, ...
MSG_ACTIVE_PROCESS_ZERO = 4
MSG_MEMORY_LIMITS = (9, 10)  # JOB_OBJECT_MSG_PROCESS_MEMORY_LIMIT, _JOB_MEMORY_LIMIT
CTRL_BREAK_EVENT = 1
INFINITE = 0xFFFFFFFF
_QUIT_KEY = 0  # a job's key is never 0 (``watch_job`` refuses it)

_ct: Any = ctypes


class _Accounting(ctypes.Structure):
    _fields_ = [("TotalUserTime", ctypes.c_longlong), ("TotalKernelTime", ctypes.c_longlong),
                ("ThisPeriodTotalUserTime", ctypes.c_longlong),
                ("ThisPeriodTotalKernelTime", ctypes.c_longlong),
                ("TotalPageFaultCount", wintypes.DWORD), ("TotalProcesses", wintypes.DWORD),
                ("ActiveProcesses", wintypes.DWORD),
                ("TotalTerminatedProcesses", wintypes.DWORD)]


class _CpuRate(ctypes.Structure):
    _fields_ = [("ControlFlags", wintypes.DWORD), ("CpuRate", wintypes.DWORD)]


class _Port(ctypes.Structure):
    _fields_ = [("CompletionKey", ctypes.c_void_p), ("CompletionPort", wintypes.HANDLE)]


@functools.cache
def _api() -> SimpleNamespace:
    k32 = _ct.WinDLL("kernel32", use_last_error=True)
    h, dword, boolean = wintypes.HANDLE, wintypes.DWORD, wintypes.BOOL
    sig = winjob.sig
    return SimpleNamespace(
        CreateIoCompletionPort=sig(k32.CreateIoCompletionPort, h, h, h, ctypes.c_void_p, dword),
        GetQueuedCompletionStatus=sig(k32.GetQueuedCompletionStatus, boolean, h,
                                      ctypes.POINTER(dword), ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.POINTER(ctypes.c_void_p), dword),
        PostQueuedCompletionStatus=sig(k32.PostQueuedCompletionStatus, boolean, h, dword,
                                       ctypes.c_void_p, ctypes.c_void_p),
        GenerateConsoleCtrlEvent=sig(k32.GenerateConsoleCtrlEvent, boolean, dword, dword),
        WaitForSingleObject=sig(k32.WaitForSingleObject, dword, h, dword),
    )


def create_named_job(name: str) -> int:
    """A new job object called ``name``; FileExistsError if that name is taken (squatted)."""
    _ct.set_last_error(0)  # "exists already" is said only through the last error
    handle = winjob.api().CreateJobObjectW(None, name)
    _check(handle, "CreateJobObjectW")
    if _ct.get_last_error() == ERROR_ALREADY_EXISTS:
        winapi.close(int(handle))
        raise FileExistsError(f"a job object called {name!r} exists already")
    return int(handle)


def open_named_job(name: str) -> int | None:
    """A handle to the live job object ``name``, None when there is none (it ended)."""
    handle = winjob.api().OpenJobObjectW(JOB_ACCESS, False, name)
    return int(handle) if handle else None


def set_cpu_rate(job: int, rate: int) -> None:
    """A hard cap: the job's processes get ``rate`` / 10000 of the machine's CPU time."""
    info = _CpuRate(CPU_RATE_ENABLE | CPU_RATE_HARD_CAP, max(1, min(10000, rate)))
    _check(winjob.api().SetInformationJobObject(job, _CPU_RATE_CONTROL, ctypes.byref(info),
                                          ctypes.sizeof(info)),
           "SetInformationJobObject(CPU rate control)")


def set_ui_limits(job: int, flags: int = UI_LIMIT_ALL) -> None:
    """No desktop switching, no clipboard, no handles of other jobs' windows, ..."""
    info = wintypes.DWORD(flags)
    _check(winjob.api().SetInformationJobObject(job, _BASIC_UI_RESTRICTIONS, ctypes.byref(info),
                                          ctypes.sizeof(info)),
           "SetInformationJobObject(UI restrictions)")


def active_processes(job: int) -> int:
    info = _Accounting()
    _check(winjob.api().QueryInformationJobObject(job, _BASIC_ACCOUNTING, ctypes.byref(info),
                                            ctypes.sizeof(info), None),
           "QueryInformationJobObject(accounting)")
    return int(info.ActiveProcesses)


def new_port() -> int:
    """A completion port for job messages (one thread reads it)."""
    handle = _api().CreateIoCompletionPort(wintypes.HANDLE(-1), None, None, 1)
    _check(handle, "CreateIoCompletionPort")
    return int(handle)


def watch_job(job: int, port: int, key: int) -> None:
    """Send ``job``'s messages (a process ended, the last one did, a memory limit was hit) to
    ``port`` under ``key`` (not 0)."""
    if key == _QUIT_KEY:
        raise ValueError("key 0 is the port's quit message")
    info = _Port(key, port)
    _check(winjob.api().SetInformationJobObject(job, _ASSOCIATE_COMPLETION_PORT, ctypes.byref(info),
                                          ctypes.sizeof(info)),
           "SetInformationJobObject(completion port)")


def next_message(port: int) -> tuple[int, int, int] | None:
    """(message, job key, pid) as the port delivers them (blocks); None after ``post_quit``."""
    msg, key, overlapped = wintypes.DWORD(), ctypes.c_void_p(), ctypes.c_void_p()
    _check(_api().GetQueuedCompletionStatus(port, ctypes.byref(msg), ctypes.byref(key),
                                            ctypes.byref(overlapped), INFINITE),
           "GetQueuedCompletionStatus")
    if not key.value:
        return None
    return int(msg.value), int(key.value), int(overlapped.value or 0)


def post_quit(port: int) -> None:
    _check(_api().PostQueuedCompletionStatus(port, 0, None, None), "PostQueuedCompletionStatus")


def ctrl_break(process_group: int) -> bool:
    """Ctrl-Break to a console process group (a process started with
    CREATE_NEW_PROCESS_GROUP, its id the leader's pid); False where it cannot be sent (it
    reaches only processes sharing this process's console)."""
    return bool(_api().GenerateConsoleCtrlEvent(CTRL_BREAK_EVENT, process_group))


def wait_process(process: int, timeout_ms: int) -> bool:
    """Whether the process ended within ``timeout_ms``."""
    return int(_api().WaitForSingleObject(process, timeout_ms)) == 0


@functools.cache
def is_wine() -> bool:
    """Whether this "Windows" is Wine (whose job objects accept limits they do not enforce)."""
    return hasattr(_ct.WinDLL("ntdll"), "wine_get_version")
