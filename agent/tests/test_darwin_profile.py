"""The darwin profile (``OARBANK_PLATFORM=darwin`` on Linux): the POSIX path as macOS runs it.

A real ``oarbank-agent run`` under the profile runs jobs through a warm service, with the
process factory off, the sandbox reported unavailable as macOS-only and groups without
cgroups (no memory or CPU limits, each absence reported), as on a Mac; and the tripwire
(``platform/darwin/linuxfree.py``) makes a Linux-only call fail, naming it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from agent_helpers import EXAMPLE, write_module

from oarbank_agent.platform import choice
from oarbank_agent.platform.darwin import linuxfree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the darwin profile is chosen on Linux (a Mac is darwin)")

PROFILE = {**os.environ, choice.ENV: "darwin"}


def _under_profile(code: str, first: str = "") -> subprocess.CompletedProcess[str]:
    """``code`` in a new Python under the profile (``first``: imported before it is made)."""
    prelude = "from oarbank_agent import platform; assert platform.current().name == 'darwin'\n"
    return subprocess.run([sys.executable, "-c", first + prelude + code], env=PROFILE,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("call, names", [
    ("import os; os.pipe2(0)", "pipe2"),
    ("import os; os.pidfd_open(os.getpid())", "pidfd_open"),
    ("import socket; socket.SOCK_CLOEXEC", "SOCK_CLOEXEC"),
    ("import socket; socket.MSG_CMSG_CLOEXEC", "MSG_CMSG_CLOEXEC"),
    ("import select; select.epoll()", "epoll"),
    ("import signal; signal.pidfd_send_signal", "pidfd_send_signal"),
    ("import os; os.posix_fadvise", "posix_fadvise"),
])
def test_what_macos_python_lacks_is_gone(call: str, names: str) -> None:
    done = _under_profile(call)
    assert done.returncode != 0
    assert "AttributeError" in done.stderr and names in done.stderr, done.stderr


@pytest.mark.parametrize("call, names", [
    ("open('/proc/self/stat')", "open('/proc/self/stat')"),
    ("import pathlib; pathlib.Path('/proc/1/cmdline').read_bytes()", "/proc/1/cmdline"),
    ("import os; os.listdir('/proc')", "os.listdir('/proc')"),
    ("import os; os.listdir('/sys/fs/cgroup')", "os.listdir('/sys/fs/cgroup')"),
    ("import os; os.chdir('/'); open('proc/self/status')", "/proc/self/status"),
    ("import ctypes; ctypes.CDLL(None).prctl", "prctl"),
    ("import ctypes; ctypes.CDLL(None).syscall", "syscall"),
    ("import subprocess; subprocess.run(['setpriv', '--help'])", "setpriv"),
])
def test_a_linux_only_call_fails_naming_itself(call: str, names: str) -> None:
    done = _under_profile(call)
    assert done.returncode != 0
    assert f"LinuxOnlyCall: {linuxfree.MESSAGE}" in done.stderr, done.stderr
    assert names in done.stderr, done.stderr


def test_a_swallowed_refusal_is_still_said() -> None:
    done = _under_profile("try:\n    open('/proc/self/stat')\nexcept Exception:\n    pass\n")
    assert done.returncode == 0, done.stderr
    assert f"oarbank tripwire: {linuxfree.MESSAGE}: open('/proc/self/stat')" in done.stderr


def test_what_macos_has_still_works() -> None:
    done = _under_profile(
        "import asyncio, os, selectors, socket, psutil, subprocess\n"
        "a, b = socket.socketpair(); a.send(b'x'); assert b.recv(1) == b'x'\n"
        "r, w = os.pipe(); os.close(r); os.close(w)\n"
        "assert selectors.DefaultSelector is selectors.PollSelector\n"
        "asyncio.run(asyncio.sleep(0))\n"
        "assert psutil.Process().pid == os.getpid()  # psutil stands in for libproc\n"
        "assert subprocess.run(['true']).returncode == 0\n"
        "open(os.devnull).close()\n"
        "print('ok')\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# What the standard library decided at import, when it still had Linux's calls, decided as
# macOS's CPython does (imported first here, as the agent has them before its platform).
@pytest.mark.parametrize("code", [
    # 3.13: the default thread pools take their size from os.process_cpu_count, which Linux's
    # CPython counts from sched_getaffinity (a NameError once that was gone)
    "import asyncio; assert asyncio.run(asyncio.to_thread(lambda: 7)) == 7",
    "import concurrent.futures as cf\nwith cf.ThreadPoolExecutor() as p: p.submit(int).result()",
    "import os; assert getattr(os, 'process_cpu_count', os.cpu_count)() == os.cpu_count()",
    "import os; assert not hasattr(os, 'sched_getaffinity')",  # still gone: macOS lacks it
    "import tempfile; tempfile.TemporaryFile().close()",  # Linux's decided on O_TMPFILE
])
def test_what_the_standard_library_decided_at_import_works_as_on_macos(code: str) -> None:
    done = _under_profile(code, first="import asyncio, concurrent.futures, os, tempfile\n")
    assert done.returncode == 0, done.stderr
    assert linuxfree.MESSAGE not in done.stderr, done.stderr


def test_an_agent_under_the_profile_starts_and_runs_a_job(start_agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """On every Python the README names (3.13's asyncio sized its default pool through
    sched_getaffinity: the agent died at its first to_thread)."""
    agent = start_agent([write_module(tmp_path / "mod")], env=PROFILE)
    job = agent.run_job("plain", {})
    assert job["state"] == "succeeded", agent.why(job)
    assert agent.status()["process_factory"]["mode"] == "off"
    assert linuxfree.MESSAGE not in agent.log() and "Traceback" not in agent.log()


def test_the_choice() -> None:
    assert choice.choose("linux", {}) == "linux"
    assert choice.choose("linux", {choice.ENV: "darwin"}) == "darwin"
    assert choice.choose("linux", {choice.ENV: "linux"}) == "linux"
    # A runner's environment carries the contract's <os>-<arch>: no choice, the agent's CLI works.
    assert choice.choose("linux", {choice.ENV: "linux-amd64"}) == "linux"
    assert choice.choose("darwin", {choice.ENV: "darwin-arm64"}) == "darwin"
    with pytest.raises(choice.BackendUnavailable, match="only 'darwin' on Linux"):
        choice.choose("darwin", {choice.ENV: "linux"})
    with pytest.raises(choice.BackendUnavailable):
        choice.choose("linux", {choice.ENV: "windows"})


def test_without_the_variable_linux_is_untouched() -> None:
    env = {k: v for k, v in os.environ.items() if k != choice.ENV}
    done = subprocess.run([sys.executable, "-c",
                           "from oarbank_agent import platform; import os\n"
                           "assert platform.current().name == 'linux'\n"
                           "os.close(os.pipe2(0)[0]); open('/proc/self/stat').close()\n"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_sandbox_required_refuses_to_start_naming_seatbelt(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "oarbank_agent", "run", "--sandbox", "required",
                           "--state-dir", str(tmp_path / "state"), "--node-id", "n",
                           "--module", str(EXAMPLE)],
                          env=PROFILE, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "sandbox-exec is macOS only" in done.stderr, done.stderr


@pytest.mark.slow
def test_an_agent_under_the_profile_runs_jobs_through_a_warm_service(start_agent) -> None:
    agent = start_agent([EXAMPLE], {"modelserver": {"load_s": 0.2, "slots": 2}}, env=PROFILE)
    jobs = [agent.run_job("generate", {"prompts": [f"p{i}"], "hold_s": 0.1},
                          module="modelserver") for i in range(2)]
    assert [j["state"] for j in jobs] == ["succeeded"] * 2, jobs
    loads = (agent.module_data("dev.example.modelserver") / "model.loads").read_text().split()
    assert len(loads) == 1  # one model load: the second job found the service warm
    assert {p for j in jobs for p in j["result"]["provenance"]["service_pids"]} == {
        int(loads[0])}
    st = agent.status()
    assert st["process_factory"]["mode"] == "off", st["process_factory"]
    assert "needs Linux" in st["process_factory"]["note"], st["process_factory"]
    sandbox = st["sandbox"]
    assert sandbox["mode"] == "auto" and "sandbox-exec is macOS only" in sandbox["note"], sandbox
    # What the kernel lacks here is reported, never silently skipped.
    assert st["containment"] == "process-group" and "darwin" in st["containment_note"], st
    assert {k: v["state"] for k, v in st["resource_limits"].items()} == {
        "memory.max": "unavailable", "cpu.max": "unavailable"}, st["resource_limits"]
    assert linuxfree.MESSAGE not in agent.log()
