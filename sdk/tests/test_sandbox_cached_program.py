"""The seccomp program a forking parent exports once (``sandbox.preload``) holds as the launcher's
own does: a child confined through the inherited program is refused, by the kernel, what the
policy refuses. Real fork, real filter, real system calls; nothing faked.

The child cannot import the seccomp binding (``sys.modules["pyseccomp"] = None``), so it cannot
have built a filter of its own: what it loaded is the parent's exported program."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from oarbank_sdk import sandbox

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not sandbox.available(),
    reason="needs the Linux sandbox (seccomp + no_new_privs)")

# Run in a process of its own: preload changes module state, and a fork of pytest would carry
# its threads. Prints one JSON line: what each confined child saw.
_SCRIPT = r"""
import ctypes, errno, json, os, socket, sys, time
from oarbank_sdk import sandbox
from oarbank_sdk.sandbox import _linux, _policy, launch
from oarbank_sdk.sandbox._notify import NOTIFIED_SYSCALLS, Watch

me = os.getpid()
sandbox.preload((me,))
keys = sorted([list(k[0]), list(k[1]), k[2]] for k in _linux._programs)

def name(e):
    return errno.errorcode.get(e, str(e))

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return name(exc.errno)

def libc_call(fn, *args):
    ctypes.set_errno(0)
    rc = fn(*args)
    return "ok" if rc >= 0 else name(ctypes.get_errno())

def confined_child(notify_fd, out_w):
    sys.modules["pyseccomp"] = None  # no binding: only the inherited program can be loaded
    req = _policy.LaunchRequest("none", ("true",), signals="open", guard_pids=(me,),
                                notify_fd=notify_fd)
    code = launch.confine_or_refuse(req, None)
    got = {"confine": code}
    if code is None:
        libc = ctypes.CDLL(None, use_errno=True)
        a, b = socket.socketpair()
        got["socketpair"] = "ok"
        got["socket_inet"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        got["socket_unix"] = attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
        got["listen"] = attempt(lambda: a.listen())
        got["connect"] = attempt(lambda: a.connect(b"\0elsewhere"))
        got["kill_guarded"] = attempt(lambda: os.kill(me, 0))  # signals "open": seccomp alone
        got["kill_self"] = attempt(lambda: os.kill(os.getpid(), 0))
        got["unshare"] = libc_call(libc.unshare, 0x20000)  # CLONE_NEWNS
        got["ptrace"] = libc_call(libc.ptrace, 0, 0, None, None)  # PTRACE_TRACEME
        with open("/proc/self/status") as f:
            status = dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)
        got["seccomp"] = status["Seccomp"].strip()
        got["filters"] = status.get("Seccomp_filters", "1").strip()
    os.write(out_w, json.dumps(got).encode())
    os._exit(0)

def run(notify):
    w = Watch() if notify else None
    r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        confined_child(w.child_fd if w else None, out_w)
    os.close(out_w)
    if w:
        w.spawned()
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    got = json.loads(data)
    if w:
        deadline = time.monotonic() + 10
        while not w.finished() and time.monotonic() < deadline:
            time.sleep(0.02)
        got["seen"] = [[a.pid == pid, a.syscall, a.family] for a in w.take()]
        w.close()
    return got

print(json.dumps({"keys": keys, "notified": list(NOTIFIED_SYSCALLS), "me": me,
                  "plain": run(False), "watched": run(True)}))
"""

_REFUSED = {"socket_inet": "EPERM", "socket_unix": "EPERM", "listen": "EPERM",
            "connect": "EPERM", "kill_guarded": "EPERM", "unshare": "EPERM", "ptrace": "EPERM"}


def _run() -> dict:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_child_confined_by_the_exported_program_is_refused_what_the_policy_refuses():
    doc = _run()
    # both programs of a launch guarding this pid were exported ahead: plain and watched
    assert doc["keys"] == sorted([[[], [doc["me"]], False],
                                  [doc["notified"], [doc["me"]], False]])
    got = doc["plain"]
    assert got.pop("confine") is None, "the child must confine itself without the binding"
    assert got == {**_REFUSED, "socketpair": "ok", "kill_self": "ok", "seccomp": "2",
                   "filters": "1"}


def test_a_watched_child_hands_over_the_listener_of_the_exported_program():
    doc = _run()
    got = doc["watched"]
    assert got.pop("confine") is None
    seen = got.pop("seen")
    assert got == {**_REFUSED, "socketpair": "ok", "kill_self": "ok", "seccomp": "2",
                   "filters": "1"}
    # the supervisor saw the child's network attempts (not the launcher's own self-test),
    # each answered EPERM as above; the rest were refused by the program itself
    assert seen == [[True, "socket", "AF_INET"], [True, "socket", "AF_UNIX"],
                    [True, "listen", ""], [True, "connect", ""]]
