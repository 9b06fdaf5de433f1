"""The conformance kit sees every network attempt of a service, not what the service says.

Each op of an endpoint service (``start``, whose daemon inherits the filter, ``ready``,
``stop``) is launched with ``--notify-fd``: the sandbox's filter sends ``socket``, ``bind``,
``listen``, ``connect``, ``accept`` and ``accept4`` to a ``oarbank_sdk.sandbox._notify.Watch``
of the kit, which records the process (pid, comm, command line) and the call, and answers
EPERM as the plain filter would. A service that tries, catches the refusal, logs nothing and
serves perfectly still fails ``no network attempts``. Nothing the service writes is read.

Test hook (``FAULT_ENV``): ``OARBANK_CONFORM_FAULT=no_attempt_watch`` launches the ops without
a watch (the sandbox still refuses every attempt; the kit just does not see them), so a test can
prove a check depends on the watch. It can only weaken the kit, is reported as a ``warn``
line (``FAULT INJECTED (test only): ...``) and in ``--json``; an unknown value is a FAIL.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

from oarbank_sdk.conform.report import FAIL, OK, WARN, Report

__all__ = ["FAULT_ENV", "FAULTS", "Attempts", "start", "summary"]

FAULT_ENV = "OARBANK_CONFORM_FAULT"
FAULTS = {"no_attempt_watch": "services are launched without the attempt watch: a refused "
                              "socket/bind/listen/connect/accept is not seen by the kit"}
CHECK = "network attempts"
WATCHED = "socket, bind, listen, connect, accept"


class Attempts:
    """The watches of one service's launches."""

    def __init__(self) -> None:
        from oarbank_sdk.sandbox import _notify

        self._notify = _notify
        self._watches: list = []
        self._kept: list = []  # attempts of watches already closed, not yet taken
        self.launches = 0

    def launch(self, argv: list[str], **walls: Any) -> tuple[list[str], Any]:
        """``argv`` inside the sandbox (``walls``: ``sandbox.wrap``'s read/write/signals) with
        a new watch: ``(argv, watch)``; the caller passes ``watch.child_fd`` to the child
        (inherited) and calls ``spawned(watch)`` after."""
        from oarbank_sdk import sandbox

        w = self._notify.Watch(name="conform-attempts")
        self._watches.append(w)
        self.launches += 1
        return sandbox.wrap(argv, notify_fd=w.child_fd, **walls), w

    def spawned(self, watch) -> None:
        watch.spawned()

    def take(self) -> list:
        """Attempts recorded since the last call (a watch whose processes are all gone is
        closed here: its descriptors go)."""
        new, self._kept = self._kept, []
        alive = []
        for w in self._watches:
            new.extend(w.take())
            if w.finished():
                w.close()
                new.extend(w.take())
            else:
                alive.append(w)
        self._watches = alive
        return new

    def errors(self) -> list[str]:
        return [w.error for w in self._watches if w.error]

    def close(self) -> None:
        for w in self._watches:
            w.close()
            self._kept.extend(w.take())
        self._watches = []


def split_gpu_driver(attempts: list, gpu: bool) -> tuple[list, list]:
    """(the attempts that fail the check, those a GPU child's driver makes). A module with
    ``[sandbox].devices.gpu = "compute"`` may make AF_UNIX stream/seqpacket sockets and nothing
    else (the launcher's ``--gpu``), so its refused ``connect()`` is on such a socket: CUDA's
    driver tries one at ``cuInit`` (seen on an H200, driver 580) and works on without it. Every
    other refused call, and any call of another module, fails."""
    if not gpu:
        return list(attempts), []
    driver = [a for a in attempts if a.syscall == "connect"]
    return [a for a in attempts if a.syscall != "connect"], driver


def summary(attempts: list, limit: int = 5) -> str:
    """``4 attempt(s) refused by the sandbox: socket(AF_INET), bind() x2 by pid 12 (python:
    python -I svc.py serve); ...``: the calls of each process, in order, then the process."""
    by_proc: dict[tuple, Counter] = {}
    for a in attempts:
        by_proc.setdefault((a.pid, a.comm, a.argv), Counter())[f"{a.syscall}({a.family})"] += 1
    parts = []
    for (pid, comm, argv), calls in list(by_proc.items())[:limit]:
        listed = ", ".join(c if n == 1 else f"{c} x{n}" for c, n in calls.items())
        parts.append(f"{listed} by pid {pid} ({comm}: {argv})")
    more = len(by_proc) - limit
    tail = f"; and {more} more process(es)" if more > 0 else ""
    return f"{len(attempts)} attempt(s) refused by the sandbox: {'; '.join(parts)}{tail}"


def start(confined: bool, report: Report) -> bool:
    """Whether the kit watches attempts here; adds the ``network attempts`` line that says so."""
    fault = os.environ.get(FAULT_ENV, "").strip()
    if fault and fault not in FAULTS:
        report.add(FAIL, CHECK, f"{FAULT_ENV}={fault!r} is not a known fault (test-only; "
                   f"known: {', '.join(FAULTS)})")
        return False
    if fault:
        report.add(WARN, CHECK, f"FAULT INJECTED (test only): {FAULT_ENV}={fault}: {FAULTS[fault]}")
        return False
    if not sys.platform.startswith("linux"):
        report.add(WARN, CHECK, f"not run on {sys.platform}: the watch is seccomp user "
                   "notification, a Linux facility; only sockets still held are seen (the "
                   "listening checks)")
        return False
    if not confined:
        report.add(WARN, CHECK, "not watched: the services run unconfined (the listening "
                   "checks still run)")
        return False
    problem = probe()
    if problem:
        report.add(WARN, CHECK, f"not watched: seccomp user notification does not work here "
                   f"({problem}); only sockets still held are seen")
        return False
    report.add(OK, CHECK, f"watched: {WATCHED} of every service process reach the kit "
               f"(seccomp user notification), each answered EPERM")
    return True


def probe() -> str | None:
    """None when a launch with a watch works here."""
    from oarbank_sdk import sandbox

    return sandbox.notify_probe()
