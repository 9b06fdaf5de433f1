"""Seccomp user notification (``oarbank_sdk.sandbox._notify``): a supervisor sees every network
attempt of a confined process and its descendants, whatever the process does with the refusal.
Real launcher, real kernel, real processes; nothing faked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from oarbank_sdk import sandbox
from oarbank_sdk.sandbox import _policy

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not sandbox.available(),
    reason="needs the Linux sandbox (seccomp + no_new_privs)")

# Tries every watched call, swallows each refusal, then forks a child that tries once more.
_TRIER = r"""
import errno, json, os, socket, sys
got = {}
def attempt(name, fn):
    try:
        fn()
        got[name] = "ok"
    except OSError as exc:
        got[name] = errno.errorcode.get(exc.errno, exc.errno)
attempt("socket_inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt("socket_unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
a, b = socket.socketpair()
got["socketpair"] = "ok"
attempt("bind", lambda: a.bind(b"\0oarbank-notify-test"))
attempt("listen", lambda: a.listen())
attempt("connect", lambda: a.connect(b"\0elsewhere"))
attempt("accept", lambda: a.accept())
pid = os.fork()
if pid == 0:
    try:
        socket.socket(socket.AF_INET6)
    except OSError:
        pass
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"pid": os.getpid(), "child": pid, "got": got}), flush=True)
"""


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _launch(w, code: str, **kw) -> subprocess.Popen:
    argv = sandbox.wrap([sys.executable, "-I", "-c", code], notify_fd=w.child_fd)
    try:
        return subprocess.Popen(argv, pass_fds=(w.child_fd,), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, **kw)
    finally:
        w.spawned()


def test_every_attempt_of_a_process_and_its_child_is_seen_and_refused():
    from oarbank_sdk.sandbox._notify import Watch

    before = _fds()
    w = Watch()
    try:
        p = _launch(w, _TRIER)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        doc = json.loads(out.strip().splitlines()[-1])
        # the process saw plain EPERM for each call, as under the plain filter
        assert doc["got"] == {"socket_inet": "EPERM", "socket_unix": "EPERM", "socketpair": "ok",
                              "bind": "EPERM", "listen": "EPERM", "connect": "EPERM",
                              "accept": "EPERM"}
        deadline = time.monotonic() + 10
        while not w.finished() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert w.finished(), "the watch must end once no process uses the filter"
        seen = [(a.pid, f"{a.syscall}({a.family})") for a in w.take()]
        # in order, each with its process; the launcher's own self-test is not among them
        assert seen == [(doc["pid"], "socket(AF_INET)"), (doc["pid"], "socket(AF_UNIX)"),
                        (doc["pid"], "bind()"), (doc["pid"], "listen()"),
                        (doc["pid"], "connect()"), (doc["pid"], "accept4()"),
                        (doc["child"], "socket(AF_INET6)")]
        first = w.attempts()[0]
        assert first.comm == "python" or first.comm.startswith("python")
        assert first.argv.startswith(f"{sys.executable} -I -c import errno")
        assert str(first).startswith(f"socket(AF_INET) by pid {doc['pid']} (python")
        assert w.take() == [] and w.total == 7 and w.error is None
    finally:
        w.close()
    assert _fds() == before


def test_calls_after_the_supervisor_closed_are_still_refused():
    from oarbank_sdk.sandbox._notify import Watch

    code = ("import socket, sys, errno\nprint('up', flush=True)\nsys.stdin.readline()\n"
            "try:\n    socket.socket()\nexcept OSError as e:\n"
            "    print(errno.errorcode[e.errno], flush=True)\n")
    w = Watch()
    try:
        p = _launch(w, code, stdin=subprocess.PIPE)
        assert p.stdout.readline() == "up\n"  # confined, verified, running
    finally:
        w.close()  # nobody answers any more
    out, _ = p.communicate("go\n", timeout=60)
    assert out.strip() == "ENOSYS"  # the kernel's answer without a supervisor: never allowed
    assert w.take() == []


def test_a_launch_waits_on_no_answer_from_its_supervisor():
    """The watched self-test asks the kernel, not the supervisor (a round trip per launch
    under a busy supervisor): with a supervisor that takes the listener and never answers,
    the launcher still verifies, says ``V`` and runs the child; the child's own network call
    is what waits, until the supervisor is gone (then ENOSYS: refused)."""
    import array
    import socket

    ours, theirs = socket.socketpair()
    code = ("import socket, errno\nprint('up', flush=True)\n"
            "try:\n    socket.socket()\nexcept OSError as e:\n"
            "    print(errno.errorcode[e.errno], flush=True)\n")
    argv = sandbox.wrap([sys.executable, "-I", "-c", code], notify_fd=theirs.fileno())
    p = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    theirs.close()
    listener = None
    try:
        ours.settimeout(30)
        got = b""
        while b"V" not in got:  # "F<pid>" with the listener, then "V" without any answer
            msg, anc, _flags, _addr = ours.recvmsg(64, socket.CMSG_SPACE(4))
            assert msg, f"the launcher closed without V: {p.stderr.read() if p.poll() else ''}"
            got += msg
            for _level, _kind, data in anc:
                listener = array.array("i", data[:4])[0]
        assert got.startswith(b"F") and listener is not None, got
        assert p.stdout.readline() == "up\n"  # the child runs, nothing answered
    finally:
        if listener is not None:
            os.close(listener)  # the supervisor is gone: the waiting call gets ENOSYS
        ours.close()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out.strip() == "ENOSYS"


def test_a_launcher_that_cannot_hand_over_its_listener_refuses_to_run_the_child():
    r, wfd = os.pipe()  # a pipe, not a socket: SCM_RIGHTS cannot go through it
    os.close(r)
    try:
        argv = sandbox.wrap([sys.executable, "-c", "print('ran')"], notify_fd=wfd)
        done = subprocess.run(argv, pass_fds=(wfd,), capture_output=True, text=True, timeout=60)
    finally:
        os.close(wfd)
    assert done.returncode == sandbox.EXIT_SETUP_FAILED
    assert "ran" not in done.stdout
    assert "cannot hand the seccomp listener to the supervisor (--notify-fd" in done.stderr


@pytest.mark.parametrize("value", ["", "x", "2", "-1"])
def test_notify_fd_must_be_a_descriptor_number(value):
    with pytest.raises(_policy.UsageError, match="--notify-fd needs a descriptor number"):
        _policy.parse_launch_args(["--notify-fd", value, "--", "true"])
    assert _policy.parse_launch_args(["--notify-fd", "7", "--", "true"]).notify_fd == 7
