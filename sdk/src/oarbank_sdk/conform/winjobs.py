"""Windows' process groups and handle handover for the conformance kit, as the Windows agent does them.

- ``Job``: a kill-on-close job object (no breakaway); ``start`` runs a process in it started
  suspended, assigned, then resumed, so nothing of it runs outside; its children are born
  inside. The kit's "process group" of an op, daemon or runner.
- ``duplicate_into`` / ``close_in``: a copy of one of our handles in another process (from
  ``OpenProcess(PROCESS_DUP_HANDLE)``), named in the message itself (``"handle": h``), and
  taking one back when the message could not be sent.

Standard library only (``_winapi`` and ``ctypes`` for the job calls ``_winapi`` lacks); it
imports everywhere, its calls need Windows.
"""

from __future__ import annotations

import ctypes
import functools
import subprocess
from types import SimpleNamespace
from typing import Any

from oarbank_sdk._winpipe import close_in, duplicate_into

__all__ = ["Job", "duplicate_into", "close_in"]

_ct: Any = ctypes  # WinDLL, get_last_error, FormatError: Windows only

_CREATE_SUSPENDED = 0x4
_PROCESS_QUERY_INFORMATION = 0x400  # Wine wants it for IsProcessInJob (not only LIMITED)
_PROCESS_START = 0x0001 | 0x0100 | 0x0800  # TERMINATE, SET_QUOTA, SUSPEND_RESUME
_KILL_ON_JOB_CLOSE = 0x2000
_EXTENDED_LIMIT_INFORMATION = 9
_BASIC_PROCESS_ID_LIST = 3
_MAX_PIDS = 1024


@functools.cache
def _api() -> SimpleNamespace:
    from ctypes import wintypes

    class Basic(ctypes.Structure):
        _fields_ = [("PerProcessUserTimeLimit", ctypes.c_int64),
                    ("PerJobUserTimeLimit", ctypes.c_int64), ("LimitFlags", wintypes.DWORD),
                    ("MinimumWorkingSetSize", ctypes.c_size_t),
                    ("MaximumWorkingSetSize", ctypes.c_size_t),
                    ("ActiveProcessLimit", wintypes.DWORD), ("Affinity", ctypes.c_size_t),
                    ("PriorityClass", wintypes.DWORD), ("SchedulingClass", wintypes.DWORD)]

    class Extended(ctypes.Structure):
        _fields_ = [("BasicLimitInformation", Basic), ("IoInfo", ctypes.c_uint64 * 6),
                    ("ProcessMemoryLimit", ctypes.c_size_t),
                    ("JobMemoryLimit", ctypes.c_size_t),
                    ("PeakProcessMemoryUsed", ctypes.c_size_t),
                    ("PeakJobMemoryUsed", ctypes.c_size_t)]

    class PidList(ctypes.Structure):
        _fields_ = [("NumberOfAssignedProcesses", wintypes.DWORD),
                    ("NumberOfProcessIdsInList", wintypes.DWORD),
                    ("ProcessIdList", ctypes.c_size_t * _MAX_PIDS)]

    def sig(fn: Any, restype: Any, *argtypes: Any) -> Any:
        fn.restype, fn.argtypes = restype, list(argtypes)
        return fn

    k32 = _ct.WinDLL("kernel32", use_last_error=True)
    ntdll = _ct.WinDLL("ntdll")
    h, dword, boolean = wintypes.HANDLE, wintypes.DWORD, wintypes.BOOL
    return SimpleNamespace(
        Extended=Extended, PidList=PidList,
        CreateJobObjectW=sig(k32.CreateJobObjectW, h, ctypes.c_void_p, wintypes.LPCWSTR),
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


def _check(ok: object, call: str) -> None:
    if not ok:
        err = _ct.get_last_error()
        raise OSError(None, f"{call}: {_ct.FormatError(err)}", None, err)


def _open(pid: int, access: int) -> int:
    handle = _api().OpenProcess(access, False, pid)
    _check(handle, f"OpenProcess({pid})")
    return int(handle)


class Job:
    """One kill-on-close job object (owned: ``close`` ends what is still in it)."""

    def __init__(self) -> None:
        api = _api()
        handle = api.CreateJobObjectW(None, None)
        _check(handle, "CreateJobObjectW")
        self.handle: int | None = int(handle)
        info = api.Extended()
        info.BasicLimitInformation.LimitFlags = _KILL_ON_JOB_CLOSE  # and never breakaway
        try:
            _check(api.SetInformationJobObject(self.handle, _EXTENDED_LIMIT_INFORMATION,
                                               ctypes.byref(info), ctypes.sizeof(info)),
                   "SetInformationJobObject")
        except BaseException:
            self.close()
            raise

    def _live(self) -> int:
        if self.handle is None:
            raise ValueError("the job object is closed")
        return self.handle

    def start(self, argv: list[str], **popen: Any) -> subprocess.Popen:
        """``subprocess.Popen(argv, **popen)`` started suspended, assigned here, resumed. A
        process that cannot be assigned is ended before it runs, and the error raised."""
        flags = popen.pop("creationflags", 0) | _CREATE_SUSPENDED
        proc = subprocess.Popen(argv, creationflags=flags, **popen)
        try:
            process = _open(proc.pid, _PROCESS_START)
            try:
                _check(_api().AssignProcessToJobObject(self._live(), process),
                       "AssignProcessToJobObject")
                status = _api().NtResumeProcess(process)
                if status != 0:
                    raise OSError(None, f"NtResumeProcess: NTSTATUS {status & 0xFFFFFFFF:#x}")
            finally:
                _api().CloseHandle(process)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        return proc

    def contains(self, pid: int) -> bool:
        """Whether process ``pid`` runs in this job (False for a pid that is gone)."""
        from ctypes import wintypes

        try:
            process = _open(pid, _PROCESS_QUERY_INFORMATION)
        except OSError:
            return False
        try:
            result = wintypes.BOOL()
            _check(_api().IsProcessInJob(process, self._live(), ctypes.byref(result)),
                   "IsProcessInJob")
            return bool(result.value)
        finally:
            _api().CloseHandle(process)

    def pids(self) -> list[int]:
        if self.handle is None:
            return []
        info = _api().PidList()
        _check(_api().QueryInformationJobObject(self.handle, _BASIC_PROCESS_ID_LIST,
                                                ctypes.byref(info), ctypes.sizeof(info), None),
               "QueryInformationJobObject")
        return [int(info.ProcessIdList[i]) for i in range(info.NumberOfProcessIdsInList)]

    def terminate(self) -> None:
        if self.handle is not None:
            _check(_api().TerminateJobObject(self.handle, 1), "TerminateJobObject")

    def close(self) -> None:
        """Close our handle: kill-on-close ends every process still in it. Idempotent."""
        handle, self.handle = self.handle, None
        if handle is not None:
            _api().CloseHandle(handle)
