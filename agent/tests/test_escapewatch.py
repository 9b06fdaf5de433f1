"""The escape check (``sandbox/escapewatch.py``) on real processes: a leader that confines
itself between the check's two reads is left alone; one that stays unconfined is killed.

The race (seen in the bench: 60 runners started at once with ``--process-factory off``, one
failed ``sandbox_escape`` with ``Seccomp 0, NoNewPrivs 1``): the check reads a leader's status
while its launcher is setting up, the launcher confines itself and execs the runner, then the
check reads the command line, which is no longer the launcher's. To make that interleaving
certain rather than lucky, the test lets the child go on at the moment the check asks for its
command line (a wrapper around the backend's real ``cmdline`` read); every status, command
line, filter and exec is the kernel's own.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from oarbank_agent import platform, procs
from oarbank_agent.sandbox import escapewatch
from oarbank_agent.sandbox import policy as sandboxing

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="reads seccomp status from /proc (Linux)"),
              pytest.mark.linux_only("the seccomp and no_new_privs status of /proc are Linux's")]

# Waits on stdin, then execs the real launcher, which confines itself and execs sleep. The
# launcher's name is spelled in two parts: its whole name on this command line would mark the
# child as a launcher in set-up, whom the check leaves alone for a while.
_CHILD = ("import os,sys;sys.stdin.readline();"
          "os.execv(sys.executable,[sys.executable,'-I','-m','oarbank_sdk.sandbox.'+'launch',"
          "'--net','none','--','/bin/sleep','60'])")


def _status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def _wait(what: str, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.01)


@pytest.fixture
def enforcing() -> Iterator[None]:
    before = sandboxing.current()
    sandboxing.install(sandboxing.SandboxPolicy("auto", True))
    try:
        yield
    finally:
        sandboxing.install(before)


@pytest.fixture
def leader() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                             start_new_session=True)
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        assert child.stdin is not None
        child.stdin.close()


def _recorded(tmp_path: Path, pid: int) -> procs.ProcessRegistry:
    registry = procs.ProcessRegistry(tmp_path)
    group = platform.current().groups.of(pid)
    registry.add(procs.GroupRecord(group, "runner", "race.1", time.time()))
    return registry


def test_a_leader_confined_between_the_checks_two_reads_is_not_killed(
        tmp_path: Path, enforcing: None, leader: subprocess.Popen[bytes],
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert _status(leader.pid)["Seccomp"] == "0"  # unconfined when the check first reads it
    registry = _recorded(tmp_path, leader.pid)
    groups = platform.current().groups
    real_cmdline = groups.cmdline

    def cmdline_after_it_confined(pid: int) -> bytes | None:
        if pid == leader.pid:
            assert leader.stdin is not None
            leader.stdin.write(b"go\n")
            leader.stdin.flush()
            _wait("the launcher to confine itself and exec sleep",
                  lambda: _status(pid)["Seccomp"] == "2"
                  and (real_cmdline(pid) or b"").startswith(b"/bin/sleep"))
        return real_cmdline(pid)

    monkeypatch.setattr(groups, "cmdline", cmdline_after_it_confined)
    assert escapewatch.check_once(registry) == []
    assert leader.poll() is None, "a confined runner was killed for its stale status"
    assert escapewatch.check_once(registry) == []  # and once settled, confined all along


def test_a_leader_that_stays_unconfined_is_killed_naming_it(
        tmp_path: Path, enforcing: None, leader: subprocess.Popen[bytes]) -> None:
    """The control: the same child never let go (not the launcher's command line, unconfined
    at both reads) is killed with its group."""
    registry = _recorded(tmp_path, leader.pid)
    reasons = escapewatch.check_once(registry)
    assert len(reasons) == 1 and f"pid {leader.pid} " in reasons[0], reasons
    assert "Seccomp 0" in reasons[0], reasons[0]
    assert leader.wait(timeout=10) == -9
