"""kernel32 and ntdll calls the Windows backend makes that ``_winapi`` lacks (ctypes); the job
object calls and the process calls under them are the SDK's (``oarbank_sdk.winjob``, one
binding for the agent and the conformance kit).

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

from oarbank_sdk.winjob import (
    CREATE_SUSPENDED,
    PROCESS_QUERY_INFORMATION,
    PROCESS_SET_QUOTA,
    PROCESS_SUSPEND_RESUME,
    PROCESS_TERMINATE,
    close,
    open_process,
    resume_process,
)
from oarbank_sdk.winjob import check as _check
from oarbank_sdk.winjob import sig as _sig

__all__ = [
    "PROCESS_DUP_HANDLE", "PROCESS_QUERY_INFORMATION", "PROCESS_SET_QUOTA", "PROCESS_TERMINATE",
    "PROCESS_SUSPEND_RESUME", "CREATE_SUSPENDED", "resume_process", "open_process", "close",
    "pipe_client_pid", "lock_file", "long_paths", "terminate_process",
    "send_ctrl_break", "has_console",
]

PROCESS_DUP_HANDLE = 0x0040

_LOCKFILE_FAIL_IMMEDIATELY = 0x1
_LOCKFILE_EXCLUSIVE_LOCK = 0x2
_ERROR_LOCK_VIOLATION = 33
_CTRL_BREAK_EVENT = 1

_ct: Any = ctypes  # WinDLL, get_last_error, FormatError: Windows only


class _Overlapped(ctypes.Structure):
    _fields_ = [("Internal", ctypes.c_size_t), ("InternalHigh", ctypes.c_size_t),
                ("Offset", wintypes.DWORD), ("OffsetHigh", wintypes.DWORD),
                ("hEvent", wintypes.HANDLE)]


@functools.cache
def _api() -> SimpleNamespace:
    k32 = _ct.WinDLL("kernel32", use_last_error=True)
    ntdll = _ct.WinDLL("ntdll")
    h, dword, boolean = wintypes.HANDLE, wintypes.DWORD, wintypes.BOOL
    return SimpleNamespace(
        TerminateProcess=_sig(k32.TerminateProcess, boolean, h, wintypes.UINT),
        GenerateConsoleCtrlEvent=_sig(k32.GenerateConsoleCtrlEvent, boolean, dword, dword),
        GetConsoleCP=_sig(k32.GetConsoleCP, wintypes.UINT),
        GetNamedPipeClientProcessId=_sig(k32.GetNamedPipeClientProcessId, boolean, h,
                                         ctypes.POINTER(wintypes.ULONG)),
        LockFileEx=_sig(k32.LockFileEx, boolean, h, dword, dword, dword, dword,
                        ctypes.POINTER(_Overlapped)),
        RtlAreLongPathsEnabled=getattr(ntdll, "RtlAreLongPathsEnabled", None),
    )


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
