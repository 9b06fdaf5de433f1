"""The Windows backend's parts: kill-on-close job objects and pipe-handle handovers.

Windows only: here they run under Wine with Windows' own CPython (``nox -s windows -- -q
agent/tests/test_windows_backend.py``; harness/tests/test_wine.py runs them from the Linux
suite), and on real Windows in the ``windows-latest`` workflow job. Real processes, real job
objects, real duplicated handles; the test plays only the agent's part of calling them.

Wine does not show, so these tests cannot either: ``IsProcessInJob`` with only
``PROCESS_QUERY_LIMITED_INFORMATION`` (the backend asks for ``PROCESS_QUERY_INFORMATION``),
job memory limits (accepted there, not enforced), Windows serialising a synchronous pipe's
I/O, ``FILE_FLAG_FIRST_PIPE_INSTANCE`` refusing a second first instance, and a DACL refusing
another user (one user per prefix).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "win32",
    reason="Windows job objects and pipe handles: run under Wine by `nox -s windows`, or on "
           "Windows")

if sys.platform == "win32":
    import _winapi

    from oarbank_agent.platform.windows.handover import BadPid, hand_over
    from oarbank_sdk.protocol import current_transport as current
    from oarbank_sdk.winjob import JobObject, start_in_job

SYNCHRONIZE = 0x00100000
WAIT_OBJECT_0 = 0

# A child that starts a grandchild, says both pids, and waits.
PARENT = r"""
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(g.pid, flush=True)
time.sleep(120)
"""


def under_wine() -> bool:
    import ctypes

    return hasattr(ctypes.WinDLL("ntdll"), "wine_get_version")


def _waitable(pid: int) -> int:
    return _winapi.OpenProcess(SYNCHRONIZE, False, pid)


def _ends_within(handle: int, ms: int = 10000) -> bool:
    return _winapi.WaitForSingleObject(handle, ms) == WAIT_OBJECT_0


def _child_and_grandchild(job: JobObject) -> tuple[subprocess.Popen, int]:
    proc = start_in_job([sys.executable, "-c", PARENT], job, stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    return proc, grandchild


def test_closing_a_job_object_ends_child_and_grandchild() -> None:
    job = JobObject()
    proc, grandchild = _child_and_grandchild(job)
    try:
        assert sorted(job.pids()) == sorted([proc.pid, grandchild])  # born inside: no escape
        assert job.contains(proc.pid) and job.contains(grandchild)
        assert not job.contains(os.getpid())
        g = _waitable(grandchild)
        job.close()
        assert _ends_within(g), "the grandchild outlived its job object"
        assert proc.wait(timeout=10) is not None
        _winapi.CloseHandle(g)
    finally:
        job.close()
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()  # type: ignore[union-attr]


def test_terminate_ends_every_process_and_the_job_stays_usable() -> None:
    with JobObject() as job:
        proc, grandchild = _child_and_grandchild(job)
        g = _waitable(grandchild)
        job.terminate(7)
        assert proc.wait(timeout=10) == 7
        assert _ends_within(g)
        _winapi.CloseHandle(g)
        assert job.pids() == []
        proc.stdout.close()  # type: ignore[union-attr]


AGENT = r"""
import subprocess, sys, time
from oarbank_sdk.winjob import JobObject, start_in_job
job = JobObject()
p = start_in_job([sys.executable, "-c", "import time; time.sleep(120)"], job)
print(p.pid, flush=True)
time.sleep(120)
"""


def test_a_killed_agent_leaves_nothing_running() -> None:
    """The kernel closes a killed process's handles: its job objects' last one with them."""
    agent = subprocess.Popen([sys.executable, "-c", AGENT], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE)
    assert agent.stdout is not None
    try:
        daemon = int(agent.stdout.readline())
        d = _waitable(daemon)
        agent.kill()  # TerminateProcess: no cleanup of its own runs
        agent.wait(timeout=10)
        assert _ends_within(d), "the agent's daemon outlived the agent"
        _winapi.CloseHandle(d)
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.stdout.close()


# Each side reads its handle value from stdin, as it would from a connector/channel message.
SERVICE = r"""
import sys
from oarbank_sdk._transport import current
conn = current().open_stream(int(sys.stdin.readline()))
conn.sendall(b"pong:" + conn.recv(100))
conn.close()
"""
JOB = r"""
import sys
from oarbank_sdk._transport import current
conn = current().open_stream(int(sys.stdin.readline()))
conn.sendall(b"ping")
print(conn.recv(100).decode(), conn.recv(100) == b"", flush=True)
"""


def _start(code: str, job: JobObject) -> subprocess.Popen:
    return start_in_job([sys.executable, "-c", code], job, stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_handover_reaches_the_service_and_the_job_in_its_attempt() -> None:
    with JobObject() as service_job, JobObject() as attempt:
        service, job = _start(SERVICE, service_job), _start(JOB, attempt)
        try:
            h = hand_over(job.pid, attempt, service.pid)
            service.stdin.write(b"%d\n" % h.service_handle)  # type: ignore[union-attr]
            service.stdin.flush()  # type: ignore[union-attr]
            job.stdin.write(b"%d\n" % h.job_handle)  # type: ignore[union-attr]
            job.stdin.flush()  # type: ignore[union-attr]
            h.close_ours()  # the receipts: their copies are theirs now
            out, err = job.communicate(timeout=60)
            assert out.decode().split() == ["pong:ping", "True"], err.decode()
            assert service.wait(timeout=30) == 0, service.stderr.read().decode()  # type: ignore[union-attr]
        finally:
            for p in (service, job):
                if p.poll() is None:
                    p.kill()
                p.communicate()


def test_a_pid_outside_the_attempt_is_bad_pid() -> None:
    with JobObject() as other, JobObject() as attempt:
        stranger = start_in_job([sys.executable, "-c", "import time; time.sleep(60)"], other)
        try:
            for pid in (stranger.pid, os.getpid(), 4_000_000):  # another job, none, no such pid
                with pytest.raises(BadPid, match=f"pid {pid} is not a process of this attempt"):
                    hand_over(pid, attempt, os.getpid())
        finally:
            stranger.kill()
            stranger.wait()


def test_pair_ends_are_pipes_nobody_else_holds() -> None:
    a, b = current().pair()
    try:
        assert _winapi.GetFileType(a.fileno()) == 3  # FILE_TYPE_PIPE
        a.sendall(b"x")
        assert b.recv(1) == b"x"
    finally:
        a.close()
        b.close()


def test_the_control_pipe_admits_only_its_user_the_administrators_and_system() -> None:
    """Read back from the kernel object. Wine runs one user per prefix, so it cannot show
    another user refused (ERROR_ACCESS_DENIED): the windows-latest job can."""
    from oarbank_agent.platform.windows import controlpipe

    name = rf"\\.\pipe\oarbank-test-{os.getpid()}-{secrets.token_hex(8)}"
    server = controlpipe.create_instance(name, first=True, overlapped=False)
    try:
        sid = controlpipe.user_sid()
        assert re.fullmatch(r"S-1-5-[0-9-]+", sid), sid
        dacl = controlpipe.dacl_of(server)
        assert dacl.startswith("D:P"), dacl  # protected: nothing inherited
        trustees = sorted(ace.split(";")[-1] for ace in re.findall(r"\(([^)]*)\)", dacl))
        assert trustees == sorted([sid, "BA", "SY"]), dacl
        if under_wine():
            # Wine does not enforce FILE_FLAG_FIRST_PIPE_INSTANCE: a second "first" instance
            # is made there. On Windows it is refused (checked below, on Windows only).
            _winapi.CloseHandle(controlpipe.create_instance(name, first=True, overlapped=False))
        else:
            with pytest.raises(OSError):  # first instance only: nobody squatted the name
                controlpipe.create_instance(name, first=True, overlapped=False)
        client = _winapi.CreateFile(name, _winapi.GENERIC_READ | _winapi.GENERIC_WRITE, 0,
                                    _winapi.NULL, _winapi.OPEN_EXISTING, 0, _winapi.NULL)
        _winapi.CloseHandle(client)  # its own user gets in
    finally:
        _winapi.CloseHandle(server)
