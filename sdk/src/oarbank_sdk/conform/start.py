"""What the conformance kit checks around one endpoint service's start, beyond exit codes.

- ``check_fingerprint``: the ``fingerprint`` op, as the agent runs it before any start: its
  ``pools`` keys must be the manifest's ``provides.pools`` and ``service_protocol.supported``
  must list 1, or every job of the service waits forever on a node;
- ``await_hello``: the hello, or why not, at once: ``ready`` is polled meanwhile (true with no
  hello fails now, not at the end of ``start_timeout_s``); a channel closed before the hello
  says whether the daemon is gone and quotes its last log line;
- ``show_logs``: the tail of the service's logs under a failing check.

The texts are ``oarbank_sdk.advice``'s: the agent says the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from oarbank_sdk import advice
from oarbank_sdk.conform import host, logs
from oarbank_sdk.conform.report import FAIL, OK, Report

__all__ = ["FINGERPRINT_TIMEOUT_S", "EXIT_WAIT_S", "check_fingerprint", "await_hello",
           "show_logs"]

FINGERPRINT_TIMEOUT_S = 5.0  # the agent's fingerprint op timeout (contract section 2)
EXIT_WAIT_S = 2.0  # after a channel closed before the hello: time for the daemon to end
# `ready` while no hello yet: first after 1 s, doubling to 2 s (each poll is a process: a
# service still coming up is not slowed by a swarm of them)
READY_POLL_FIRST_S = 1.0
READY_POLL_MAX_S = 2.0


class Service(Protocol):
    """What these checks need of ``conform.ServiceUnderTest``."""

    label: str
    report: Report
    logs: Path  # <node>/ops/<service>: each op's .out/.err
    pgid: int | None

    def _op(self, op: str, timeout_s: float) -> host.OpResult: ...


def check_fingerprint(s: Service, provides: tuple[str, ...]) -> None:
    name = f"{s.label}: fingerprint"
    r = s._op("fingerprint", FINGERPRINT_TIMEOUT_S)
    if r.timed_out:
        s.report.add(FAIL, name, f"no answer within {FINGERPRINT_TIMEOUT_S:g} s")
        return
    if r.rc != 0 or r.doc is None:
        s.report.add(FAIL, name, f"exit {r.rc}, no JSON object on stdout: {r.tail()}")
        return
    problems = advice.fingerprint_problems(r.doc, provides)
    if problems:
        s.report.add(FAIL, name, "; ".join(problems))
    else:
        s.report.add(OK, name, f"pools {r.doc['pools']} (provides.pools), service protocol 1")


def await_hello(s: Service, ch: host.Channel, data_dir: Path, deadline: float,
                limit_s: float, ready: Callable[[float], bool]) -> int | None:
    """The hello's pid, or None after a FAIL naming the fix. ``ready(timeout_s)`` runs the
    ``ready`` op and says whether it answered true."""
    delay = READY_POLL_FIRST_S
    while True:
        left = deadline - time.monotonic()
        pid = ch.wait_hello(min(delay, max(0.0, left)))
        if pid is not None:
            return pid
        if ch.closed_reason:
            break
        if left <= 0:
            s.report.add(FAIL, f"{s.label}: hello", advice.no_hello(limit_s))
            show_logs(s, data_dir)
            return None
        if ready(min(5.0, max(0.1, deadline - time.monotonic()))) and ch.hello_pid is None:
            s.report.add(FAIL, f"{s.label}: hello", advice.ready_before_hello())
            show_logs(s, data_dir)
            return None
        delay = min(delay * 2, READY_POLL_MAX_S)
    # Closed before the hello: give the daemon a moment to end (and to write why).
    gone_by = time.monotonic() + EXIT_WAIT_S
    left_pids = host.group_pids(s.pgid) if s.pgid else []
    while left_pids and time.monotonic() < gone_by:
        time.sleep(0.05)
        left_pids = host.group_pids(s.pgid) if s.pgid else []
    closed = ch.closed_reason or advice.channel_closed("end of file")
    s.report.add(FAIL, f"{s.label}: hello", advice.closed_before_hello(
        closed, bool(left_pids), logs.last_line(s.logs, data_dir)))
    show_logs(s, data_dir)
    return None


def show_logs(s: Service, data_dir: Path) -> None:
    lines = logs.tail(s.logs, data_dir)
    s.report.note([f"{s.label}: the end of its logs"] + lines if lines
                  else [f"{s.label}: its logs are empty"])
