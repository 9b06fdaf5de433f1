"""A folder and its files kept to the agent's user on Windows: the owner's SID checked, a
protected DACL (the user, the administrators, SYSTEM; inherited by what is made inside) set.

Windows has no modes: ``os.stat`` says every file is uid 0 and ``os.chmod`` only flips the
read-only bit. What keeps others out is the folder's DACL, and who may change it is its owner.
So a folder whose owner is another user (anyone but this user, the administrators or SYSTEM,
who can do anything on the machine anyway) is refused, and ours gets the DACL, protected (no
entry inherited from above) with object and container inheritance, so that every file and
folder the agent makes inside has it from its creation.
"""

from __future__ import annotations

import ctypes
from ctypes import wintypes
from pathlib import Path
from typing import Any

from oarbank_agent.platform.windows.controlpipe import TRUSTED_OWNERS, user_sid

__all__ = ["owner_of_path", "make_private", "private_sddl", "sddl_of"]

_SE_FILE_OBJECT = 1
_OWNER_SECURITY_INFORMATION = 0x1
_DACL_SECURITY_INFORMATION = 0x4
_PROTECTED_DACL_SECURITY_INFORMATION = 0x80000000
_SDDL_REVISION_1 = 1

_ct: Any = ctypes  # WinDLL, get_last_error, FormatError: Windows only (imports everywhere)


def _dlls() -> tuple[Any, Any]:
    return (_ct.WinDLL("kernel32", use_last_error=True),
            _ct.WinDLL("advapi32", use_last_error=True))


def private_sddl(sid: str) -> str:
    """A protected DACL: full access for ``sid``, the administrators and SYSTEM, inherited by
    files (OI) and folders (CI) made inside."""
    return f"D:P(A;OICI;FA;;;{sid})(A;OICI;FA;;;BA)(A;OICI;FA;;;SY)"


def owner_of_path(path: Path) -> str:
    """The owner of a file or folder as a SID string. Raises OSError."""
    k32, adv = _dlls()
    owner = ctypes.c_void_p()
    descriptor = ctypes.c_void_p()
    err = adv.GetNamedSecurityInfoW(str(path), _SE_FILE_OBJECT, _OWNER_SECURITY_INFORMATION,
                                    ctypes.byref(owner), None, None, None,
                                    ctypes.byref(descriptor))
    if err:
        raise OSError(None, f"GetNamedSecurityInfoW({path}): {_ct.FormatError(err)}", None, err)
    try:
        return _as_text(k32, "ConvertSidToStringSidW",
                        lambda out: adv.ConvertSidToStringSidW(owner, out))
    finally:
        k32.LocalFree(descriptor)


def _as_text(k32: Any, name: str, convert: Any) -> str:
    """What ``convert(byref(text))`` writes to ``text`` (the system's allocation, freed
    here). Raises OSError naming ``name`` when it fails."""
    text = ctypes.c_wchar_p()
    if not convert(ctypes.byref(text)):
        raise OSError(None, f"{name}: {_ct.FormatError(_ct.get_last_error())}")
    try:
        return str(text.value)
    finally:
        k32.LocalFree(text)


def sddl_of(handle: int) -> str:
    """The DACL of the open file ``handle`` as SDDL text. Raises OSError."""
    k32, adv = _dlls()
    dacl, descriptor = ctypes.c_void_p(), ctypes.c_void_p()
    err = adv.GetSecurityInfo(wintypes.HANDLE(handle), _SE_FILE_OBJECT,
                              _DACL_SECURITY_INFORMATION, None, None, ctypes.byref(dacl), None,
                              ctypes.byref(descriptor))
    if err:
        raise OSError(None, f"GetSecurityInfo: {_ct.FormatError(err)}", None, err)
    try:
        return _as_text(k32, "ConvertSecurityDescriptorToStringSecurityDescriptorW",
                        lambda out: adv.ConvertSecurityDescriptorToStringSecurityDescriptorW(
                            descriptor, _SDDL_REVISION_1, _DACL_SECURITY_INFORMATION, out,
                            None))
    finally:
        k32.LocalFree(descriptor)


def foreign_owner(path: Path) -> str | None:
    """The owner's SID when it is not this user's nor a trusted one, else None."""
    owner = owner_of_path(path)
    return None if owner == user_sid() or owner in TRUSTED_OWNERS else owner


def make_private(path: Path) -> None:
    """Set ``private_sddl`` of this user on ``path``. Raises OSError."""
    k32, adv = _dlls()
    descriptor = ctypes.c_void_p()
    if not adv.ConvertStringSecurityDescriptorToSecurityDescriptorW(
            private_sddl(user_sid()), _SDDL_REVISION_1, ctypes.byref(descriptor), None):
        raise OSError(None, "ConvertStringSecurityDescriptorToSecurityDescriptorW: "
                      f"{_ct.FormatError(_ct.get_last_error())}")
    try:
        present, defaulted = wintypes.BOOL(), wintypes.BOOL()
        dacl = ctypes.c_void_p()
        if not adv.GetSecurityDescriptorDacl(descriptor, ctypes.byref(present),
                                             ctypes.byref(dacl), ctypes.byref(defaulted)):
            raise OSError(None, f"GetSecurityDescriptorDacl: "
                          f"{_ct.FormatError(_ct.get_last_error())}")
        err = adv.SetNamedSecurityInfoW(
            str(path), _SE_FILE_OBJECT,
            wintypes.DWORD(_DACL_SECURITY_INFORMATION | _PROTECTED_DACL_SECURITY_INFORMATION),
            None, None, dacl, None)
        if err:
            raise OSError(None, f"SetNamedSecurityInfoW({path}): {_ct.FormatError(err)}", None,
                          err)
    finally:
        k32.LocalFree(descriptor)
