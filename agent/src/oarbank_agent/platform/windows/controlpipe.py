"""The control endpoint's pipe on Windows: a named pipe whose DACL admits only the agent's own
user, the administrators and SYSTEM, set when the first instance is created (so there is no
moment when anyone else may open it), remote clients refused.

The DACL is protected (``P``: nothing inherited) and lists exactly three allow entries; a
client outside them gets ERROR_ACCESS_DENIED from ``CreateFile``. The owner is the agent's
user, set explicitly (an elevated token would make it the administrators otherwise), so a
client can tell the agent's pipe from one another user made under the same name
(``owner_of``). The serving loop around it is ``pipeserver.py``.
"""

from __future__ import annotations

import ctypes
import functools
from ctypes import wintypes
from typing import Any

__all__ = ["user_sid", "owner_only_sddl", "create_instance", "dacl_of", "owner_of",
           "TRUSTED_OWNERS"]

# Owners a client trusts besides its own user: SYSTEM and the administrators (who can do
# anything on the machine anyway); an ordinary other user cannot give away ownership.
TRUSTED_OWNERS = ("SY", "BA", "S-1-5-18", "S-1-5-32-544")  # SDDL writes aliases

_PIPE_ACCESS_DUPLEX = 0x3
_FILE_FLAG_FIRST_PIPE_INSTANCE = 0x00080000
_FILE_FLAG_OVERLAPPED = 0x40000000
_PIPE_REJECT_REMOTE_CLIENTS = 0x8
_PIPE_UNLIMITED_INSTANCES = 255
_TOKEN_QUERY = 0x0008
_TOKEN_USER = 1
_SDDL_REVISION_1 = 1
_SE_KERNEL_OBJECT = 6
_OWNER_SECURITY_INFORMATION = 0x1
_DACL_SECURITY_INFORMATION = 0x4
_INVALID_HANDLE = ctypes.c_void_p(-1).value

_ct: Any = ctypes  # WinDLL, get_last_error, FormatError: Windows only (imports everywhere)


@functools.cache
def _dlls() -> tuple[Any, Any]:
    return (_ct.WinDLL("kernel32", use_last_error=True),
            _ct.WinDLL("advapi32", use_last_error=True))


class _SecurityAttributes(ctypes.Structure):
    _fields_ = [("nLength", wintypes.DWORD), ("lpSecurityDescriptor", ctypes.c_void_p),
                ("bInheritHandle", wintypes.BOOL)]


def _fail(call: str) -> OSError:
    err = _ct.get_last_error()
    return OSError(None, f"{call}: {_ct.FormatError(err)}", None, err)


def user_sid() -> str:
    """This process's user as a SID string (``S-1-5-21-...``)."""
    _k32, _adv = _dlls()
    token = wintypes.HANDLE()
    process = _k32.GetCurrentProcess()
    if not _adv.OpenProcessToken(wintypes.HANDLE(process), _TOKEN_QUERY, ctypes.byref(token)):
        raise _fail("OpenProcessToken")
    try:
        size = wintypes.DWORD()
        _adv.GetTokenInformation(token, _TOKEN_USER, None, 0, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        if not _adv.GetTokenInformation(token, _TOKEN_USER, buf, size, ctypes.byref(size)):
            raise _fail("GetTokenInformation")
        sid = ctypes.c_void_p.from_buffer(buf).value  # TOKEN_USER.User.Sid, its first field
        text = ctypes.c_wchar_p()
        if not _adv.ConvertSidToStringSidW(ctypes.c_void_p(sid), ctypes.byref(text)):
            raise _fail("ConvertSidToStringSidW")
        return _take_local_text(_k32, text)
    finally:
        _k32.CloseHandle(token)


def _take_local_text(k32: Any, text: ctypes.c_wchar_p) -> str:
    """A string the system allocated for us (the SDDL converters' output), copied, then
    given back with ``LocalFree``."""
    try:
        return str(text.value)
    finally:
        k32.LocalFree(text)


def owner_only_sddl(sid: str) -> str:
    """Owner ``sid``; protected DACL: full access for ``sid``, the administrators (BA) and
    SYSTEM (SY)."""
    return f"O:{sid}D:P(A;;GA;;;{sid})(A;;GA;;;BA)(A;;GA;;;SY)"


def create_instance(name: str, *, first: bool, overlapped: bool = True) -> int:
    """One server instance of the pipe ``name`` (``\\\\.\\pipe\\...``) under the owner-only
    DACL. ``first``: fail if the name exists already (another process squatting it)."""
    _k32, _adv = _dlls()
    descriptor = ctypes.c_void_p()
    if not _adv.ConvertStringSecurityDescriptorToSecurityDescriptorW(
            owner_only_sddl(user_sid()), _SDDL_REVISION_1, ctypes.byref(descriptor), None):
        raise _fail("ConvertStringSecurityDescriptorToSecurityDescriptorW")
    try:
        attrs = _SecurityAttributes(ctypes.sizeof(_SecurityAttributes), descriptor.value, False)
        mode = _PIPE_ACCESS_DUPLEX | (_FILE_FLAG_FIRST_PIPE_INSTANCE if first else 0)
        if overlapped:
            mode |= _FILE_FLAG_OVERLAPPED
        create = _k32.CreateNamedPipeW
        create.restype = wintypes.HANDLE
        create.argtypes = [wintypes.LPCWSTR, wintypes.DWORD, wintypes.DWORD, wintypes.DWORD,
                           wintypes.DWORD, wintypes.DWORD, wintypes.DWORD, ctypes.c_void_p]
        handle = create(name, mode, _PIPE_REJECT_REMOTE_CLIENTS, _PIPE_UNLIMITED_INSTANCES,
                        65536, 65536, 0, ctypes.byref(attrs))
        if handle is None or handle == _INVALID_HANDLE:
            raise _fail(f"CreateNamedPipeW({name})")
        return int(handle)
    finally:
        _k32.LocalFree(descriptor)


def dacl_of(handle: int) -> str:
    """The DACL of a kernel object as SDDL (what ``create_instance`` set, read back)."""
    return _security_text(handle, _DACL_SECURITY_INFORMATION)


def owner_of(handle: int) -> str:
    """The owner of a kernel object as a SID string (``O:`` stripped)."""
    text = _security_text(handle, _OWNER_SECURITY_INFORMATION)
    return text[2:] if text.startswith("O:") else text


def _security_text(handle: int, which: int) -> str:
    _k32, _adv = _dlls()
    descriptor = ctypes.c_void_p()
    err = _adv.GetSecurityInfo(wintypes.HANDLE(handle), _SE_KERNEL_OBJECT, which, None, None,
                               None, None, ctypes.byref(descriptor))
    if err:
        raise OSError(None, f"GetSecurityInfo: {_ct.FormatError(err)}", None, err)
    try:
        text = ctypes.c_wchar_p()
        if not _adv.ConvertSecurityDescriptorToStringSecurityDescriptorW(
                descriptor, _SDDL_REVISION_1, which, ctypes.byref(text), None):
            raise _fail("ConvertSecurityDescriptorToStringSecurityDescriptorW")
        return _take_local_text(_k32, text)
    finally:
        _k32.LocalFree(descriptor)
