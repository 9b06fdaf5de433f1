"""The portal token on Windows: refused while its DACL lets anyone but this user read it.

The SDDL reading (``platform/windows/dacl.py``) is pure and tested everywhere, on DACLs as
Windows and Wine write them. The file checks run on Windows only: here under Wine with
Windows' own CPython (``nox -s windows``; harness/tests/test_wine.py runs them from the Linux
suite), and on real Windows in the ``windows-latest`` workflow job. Each token file is made
with ``CreateFileW`` and an explicit security descriptor, so both systems start from the same
DACL. Wine keeps a file's DACL as its Unix mode (user, group, others), so it cannot show a DACL
naming a second user, nor one that Unix modes cannot say; the Everyone case is what it can.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from oarbank_agent.platform.windows.dacl import other_readers

ME = "S-1-5-21-1004336348-1177238915-682003330-1001"


def test_only_this_user_system_and_administrators_read() -> None:
    assert other_readers(f"D:P(A;OICI;FA;;;{ME})(A;OICI;FA;;;BA)(A;OICI;FA;;;SY)", ME) == []
    # As Wine derives it from mode 0600 (the owner's SID and SYSTEM)
    assert other_readers("O:S-1-5-21-0-0-0-1000D:(A;;FA;;;SY)(A;;FA;;;S-1-5-21-0-0-0-1000)",
                         "S-1-5-21-0-0-0-1000") == []


def test_everyone_users_or_another_sid_reading_is_named() -> None:
    # Wine's view of a mode 0644 file: Everyone gets read and execute (0x1200a9)
    assert other_readers("D:(A;;FA;;;SY)(A;;FA;;;S-1-5-21-0-0-0-1000)(A;;0x1200a9;;;WD)",
                         "S-1-5-21-0-0-0-1000") == ["Everyone"]
    # a folder under C:\ as Windows makes it: Users may read what is inherited
    assert other_readers(f"D:AI(A;ID;FA;;;{ME})(A;ID;FA;;;SY)(A;ID;0x1200a9;;;BU)"
                         "(A;ID;FA;;;BA)", ME) == ["Users"]
    assert other_readers(f"D:P(A;;FA;;;{ME})(A;;FR;;;S-1-5-21-1-2-3-1002)", ME) == [
        "S-1-5-21-1-2-3-1002"]
    assert other_readers(f"D:P(A;;FA;;;{ME})(A;;GR;;;AU)", ME) == ["Authenticated Users"]
    # FILE_READ_DATA alone, in the directory service's letters (CC) or as a number
    assert other_readers(f"D:P(A;;FA;;;{ME})(A;;CCLCRC;;;WD)", ME) == ["Everyone"]
    assert other_readers(f"D:P(A;;FA;;;{ME})(A;;0x1;;;WD)", ME) == ["Everyone"]


def test_no_dacl_lets_everyone_in() -> None:
    assert other_readers("D:NO_ACCESS_CONTROL", ME) == ["Everyone"]
    assert other_readers(f"O:{ME}", ME) == ["Everyone"]


def test_what_does_not_let_anyone_read_is_not_counted() -> None:
    # write-only, a deny, an audit (in the SACL), an entry only for what is made inside
    assert other_readers(f"D:P(A;;FA;;;{ME})(A;;FW;;;WD)(D;;FA;;;BU)(A;OICIIO;FA;;;CO)"
                         "S:(AU;SA;FA;;;WD)", ME) == []
    # read attributes and the security descriptor, not the data
    assert other_readers(f"D:P(A;;FA;;;{ME})(A;;0x120080;;;WD)", ME) == []


windows = pytest.mark.skipif(sys.platform != "win32", reason=(
    "a token file's DACL: run under Wine by `nox -s windows`, or on Windows"))


def _token_file(path: Path, sddl: str) -> Path:
    """``path`` made with this DACL (CreateFileW with a security descriptor), holding a
    token."""
    import ctypes
    from ctypes import wintypes

    class SecurityAttributes(ctypes.Structure):
        _fields_ = [("nLength", wintypes.DWORD), ("lpSecurityDescriptor", ctypes.c_void_p),
                    ("bInheritHandle", wintypes.BOOL)]

    k32 = ctypes.WinDLL("kernel32", use_last_error=True)
    adv = ctypes.WinDLL("advapi32", use_last_error=True)
    sd = ctypes.c_void_p()
    assert adv.ConvertStringSecurityDescriptorToSecurityDescriptorW(sddl, 1, ctypes.byref(sd),
                                                                     None)
    k32.CreateFileW.restype = ctypes.c_void_p
    sa = SecurityAttributes(ctypes.sizeof(SecurityAttributes), sd, False)
    handle = k32.CreateFileW(str(path), 0x40000000, 0, ctypes.byref(sa), 1, 0x80, None)
    assert handle not in (None, ctypes.c_void_p(-1).value), ctypes.get_last_error()
    written = wintypes.DWORD()
    assert k32.WriteFile(ctypes.c_void_p(handle), b"oarbank_secret\r\n", 16,
                         ctypes.byref(written), None)
    k32.CloseHandle(ctypes.c_void_p(handle))
    k32.LocalFree(sd)
    return path


@windows
def test_a_token_everyone_may_read_is_refused_naming_who(tmp_path: Path) -> None:
    from oarbank_agent.platform.windows.controlpipe import user_sid
    from oarbank_agent.reporting.heartbeat import read_token_file

    f = _token_file(tmp_path / "token", f"D:P(A;;FA;;;{user_sid()})(A;;FR;;;WD)")
    with pytest.raises(ValueError, match=r"its DACL lets Everyone read it; keep it to this "
                                         r"user: icacls .* /inheritance:r /grant:r"):
        read_token_file(str(f))


@windows
def test_a_token_only_this_user_reads_is_taken(tmp_path: Path) -> None:
    from oarbank_agent.platform.windows.controlpipe import user_sid
    from oarbank_agent.reporting.heartbeat import read_token_file

    f = _token_file(tmp_path / "token", f"D:P(A;;FA;;;{user_sid()})(A;;FA;;;SY)")
    assert read_token_file(str(f)) == "oarbank_secret"
