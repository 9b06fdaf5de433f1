"""One endpoint service run by the conformance kit as the agent runs it (``kit``'s step 3, and
its stop in step 8): fingerprint, start, hello, ``ready``, handed connections, ``ended``, no
network attempts, never listening, stop and its process group gone.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from oarbank_sdk import _transport
from oarbank_sdk import manifest as _manifest
from oarbank_sdk.conform import attempts as attempts_watch
from oarbank_sdk.conform import host
from oarbank_sdk.conform import start as starting
from oarbank_sdk.conform.listeners import blind_spot, listeners, related_pids, split_gpu_driver
from oarbank_sdk.conform.report import FAIL, OK, SKIP, WARN, Report
from oarbank_sdk.endpoint.service import FEATURES_ENV

__all__ = ["ServiceUnderTest", "Wrap", "gpu_compute", "SPECS_ATTEMPT"]

SPECS_ATTEMPT = "conform-specs"
ENDED_WAIT_S = 5.0
GROUP_GONE_WAIT_S = 10.0
READY_OP_TIMEOUT_S = 5.0  # contract section 2
# What the kit offers endpoint services, as an agent does (contract section 3).
OFFERED_FEATURES = "ready"

Wrap = Callable[..., list[str]]  # wrap(argv, read=..., write=..., signals=...) -> argv


def gpu_compute(m: _manifest.Manifest) -> bool:
    """``[sandbox].devices.gpu = "compute"``: the agent grants the GPU device nodes."""
    devices = (m.sandbox or {}).get("devices") or {}
    return isinstance(devices, dict) and devices.get("gpu") == "compute"


# --- one endpoint service ----------------------------------------------------------------------


class ServiceUnderTest:
    """One endpoint service run as the agent runs it."""

    def __init__(self, m: _manifest.Manifest, svc: _manifest.Service, node: host.NodeDirs,
                 wrap: Wrap, confined: bool, report: Report, watch: bool = False) -> None:
        self.m, self.svc, self.node, self.report = m, svc, node, report
        self.wrap, self.confined = wrap, confined
        # Every launch of this service's ops with a seccomp watch (None: attempts not watched)
        self.attempts = attempts_watch.Attempts() if watch else None
        self.argv = node.expand(svc.exec, m.bundle)
        self.label = f"service {svc.name}"
        self.channel: host.Channel | None = None
        self.pgid: int | None = None
        self.ready = False
        self.logs = node.root / "ops" / svc.name
        self.logs.mkdir(parents=True, exist_ok=True)

    def _op(self, op: str, timeout_s: float, env_extra: dict[str, str] | None = None,
            inherit: tuple[int, ...] = ()) -> host.OpResult:
        env = host.op_env(self.node, self.svc.name)
        env[FEATURES_ENV] = OFFERED_FEATURES  # as an agent offers them (contract section 3)
        env.update(env_extra or {})
        # The agent's walls for ops: read the bundle and the node's files, write the data dir;
        # signals open between the service's own processes (`stop` signals the daemon).
        walls: dict[str, Any] = {
            "read": [self.m.bundle, self.node.settings_file, self.node.limits_file,
                     self.node.tools_file, *self.node.env_reads],
            "write": [self.node.data], "signals": "open", "gpu": gpu_compute(self.m)}
        if self.attempts is None:
            return host.run_op(self.wrap(self.argv, **walls), op, env, self.m.bundle,
                               max(0.1, timeout_s), inherit=inherit,
                               output_prefix=self.logs / op)
        argv, w = self.attempts.launch(self.argv, **walls)
        try:
            return host.run_op(argv, op, env, self.m.bundle, max(0.1, timeout_s),
                               inherit=(*inherit, w.child_fd), output_prefix=self.logs / op)
        finally:
            self.attempts.spawned(w)

    def _ready_true(self, timeout_s: float) -> bool:
        r = self._op("ready", timeout_s)
        return r.rc == 0 and r.doc is not None and r.doc.get("ready") is True

    def _said_ready(self, deadline: float) -> dict | str | None:
        """The service said `ready`: what the `ready` op answers now (it must agree: agents
        that do not offer the feature poll it)."""
        r = self._op("ready", max(0.1, min(READY_OP_TIMEOUT_S, deadline - time.monotonic())))
        return r.doc if r.rc == 0 else f"exit {r.rc}: {r.tail(120)}"

    def start(self) -> None:
        starting.check_fingerprint(self, self.svc.pools)
        t0 = time.monotonic()
        limit = self.svc.start_timeout_s
        deadline = t0 + limit
        self.channel = ch = host.Channel()
        r = self._op("start", limit, {"OARBANK_ENDPOINT_CHANNEL": ch.env_value},
                     inherit=(ch.child_fd,) if ch.child_fd is not None else ())
        ch.close_child_end()  # only the service holds it now
        self.pgid = r.pid  # state: the service's process group exists from here on
        if r.timed_out:
            self.report.add(FAIL, f"{self.label}: start", f"did not exit within start_timeout_s "
                            f"({limit:g} s); its process group was ended")
        elif r.rc != 0:
            self.report.add(FAIL, f"{self.label}: start", f"exit {r.rc}: {r.tail()}")
        elif not (r.doc and r.doc.get("ok") is True):
            self.report.add(FAIL, f"{self.label}: start",
                            f'exit 0 but stdout has no {{"ok": true}} line: {r.tail()}')
        else:
            self.report.add(OK, f"{self.label}: start", f"exit 0 in {r.elapsed_s:.2f} s")
        if r.rc != 0 or r.timed_out:
            starting.show_logs(self, self.node.data)
            self.report.add(SKIP, f"{self.label}: hello", "start failed")
            self.report.add(SKIP, f"{self.label}: ready", "start failed")
            self.check_listening("after start", failed_start=True)
            return

        pid = starting.await_hello(self, ch, self.node.data, deadline, limit, self._ready_true)
        if pid is None:
            self.report.add(SKIP, f"{self.label}: ready", "no hello")
            self.check_listening("after start", failed_start=True)
            return
        self.report.add(OK, f"{self.label}: hello", f"pid {pid} after {time.monotonic() - t0:.2f} s")

        # Poll `ready` as the agent does, first after 50 ms, backing off to 1 s, until it
        # answers true or the service says `ready` on the channel.
        delay, last = 0.05, None
        while True:
            ch.ready_event.wait(max(0.0, min(delay, deadline - time.monotonic())))
            if ch.said_ready:
                last = self._said_ready(deadline)
                break
            r = self._op("ready", min(READY_OP_TIMEOUT_S, deadline - time.monotonic()))
            if not r.timed_out or last is None:  # a poll cut short by the deadline says nothing
                last = r.doc if r.rc == 0 else (
                    "no answer before the deadline" if r.timed_out else f"exit {r.rc}: {r.tail(120)}")
            if r.rc == 0 and r.doc and r.doc.get("ready") is True:
                break
            if ch.closed_reason or time.monotonic() >= deadline:
                break
            delay = min(delay * 2, 1.0)
        if ch.closed_reason:
            self.report.add(FAIL, f"{self.label}: ready", ch.closed_reason)
        elif isinstance(last, dict) and last.get("ready") is True:
            self.ready = True  # state: ready = ready true AND hello AND channel open
            how = ("said on the channel; the ready op agrees" if ch.said_ready else
                   "the ready op polled: the service does not say ready on the channel "
                   "(optional: Acceptor.ready() starts jobs without waiting for a poll)")
            self.report.add(OK, f"{self.label}: ready",
                            f"after {time.monotonic() - t0:.2f} s ({how})")
        elif ch.said_ready:
            self.report.add(FAIL, f"{self.label}: ready", f"said on the channel, but the ready op "
                            f"answers {json.dumps(last)[:200]}: an agent that does not offer "
                            "the ready feature polls the op, and would never count it ready")
        else:
            self.report.add(FAIL, f"{self.label}: ready", f"not true within start_timeout_s "
                            f"({limit:g} s); last answer: {json.dumps(last)[:200]}")
        if not self.ready:
            starting.show_logs(self, self.node.data)
        self.check_listening("after ready" if self.ready else "after start",
                             failed_start=not self.ready)

    def check_attempts(self, when: str) -> None:
        """Every socket/bind/listen/connect/accept a process of the service tried since the
        last check, as the sandbox's watch saw it (whether or not the service reported it)."""
        if self.attempts is None:
            return
        name = f"{self.label}: no network attempts ({when})"
        new, driver = attempts_watch.split_gpu_driver(self.attempts.take(),
                                                      gpu_compute(self.m))
        if new:
            self.report.add(FAIL, name, attempts_watch.summary(new))
        elif self.attempts.errors():
            self.report.add(FAIL, name, f"the watch stopped: {'; '.join(self.attempts.errors())}")
        elif driver:
            self.report.add(WARN, name, attempts_watch.summary(driver) + ": connect() from a "
                            "GPU child (devices.gpu = \"compute\"), on the only sockets it can "
                            "make (AF_UNIX stream/seqpacket): its driver's, refused")
        else:
            self.report.add(OK, name, f"none ({self.attempts.launches} launch(es) watched)")

    def check_listening(self, when: str, failed_start: bool = False) -> None:
        self.check_attempts(when)
        name = f"{self.label}: never listens ({when})"
        blind = blind_spot()
        if blind:
            self.report.add(WARN, name, f"not run: {blind}")
            return
        extra = (self.channel.hello_pid,) if self.channel and self.channel.hello_pid else ()
        pids = related_pids(self.pgid, extra)
        found, driver = split_gpu_driver(listeners(pids), gpu_compute(self.m))
        if found:
            self.report.add(FAIL, name, "; ".join(str(x) for x in found))
            return
        if driver:
            self.report.add(WARN, name, "; ".join(str(x) for x in driver) + ": a GPU driver's "
                            "abstract socket (devices.gpu = \"compute\"), reachable only inside "
                            "its sandbox")
            return
        if failed_start and not pids:
            self.report.add(SKIP, name, "no process of the service is left to inspect")
            return
        self.report.add(OK, name, f"no listening socket in {len(pids)} process(es)")

    def hand(self, attempt: str) -> socket.socket:
        assert self.channel is not None
        ours, theirs = _transport.current().pair()
        try:
            self.channel.hand(attempt, theirs)
        except OSError:
            ours.close()
            raise
        return ours

    def check_ended(self, leftover: socket.socket | None) -> None:
        name = f"{self.label}: ended"
        assert self.channel is not None
        try:
            self.channel.ended(SPECS_ATTEMPT)
        except OSError as exc:
            self.report.add(FAIL, name, f"cannot send ended: {exc}")
            return
        if leftover is None:
            self.report.add(OK, name, "sent")
            return
        leftover.settimeout(ENDED_WAIT_S)
        try:
            data = leftover.recv(1)
        except TimeoutError:
            self.report.add(FAIL, name, f"the attempt's open connection was still open "
                            f"{ENDED_WAIT_S:g} s after ended")
            return
        except OSError:
            data = b""
        if data:
            self.report.add(FAIL, name, f"unexpected data on an idle connection: {data!r}")
        else:
            self.report.add(OK, name, "the service closed the attempt's connections")

    def check_channel(self) -> None:
        assert self.channel is not None
        ch = self.channel
        deadline = time.monotonic() + 2
        while ch.pending_receipts() and time.monotonic() < deadline:
            time.sleep(0.02)
        problems = list(ch.problems)
        if ch.pending_receipts():
            problems.append(f"{ch.pending_receipts()} of {ch.handed} handed connection(s) "
                            f"never acknowledged with 'accepted'")
        if ch.closed_reason:
            problems.append(ch.closed_reason)
        if problems:
            self.report.add(FAIL, f"{self.label}: channel protocol", "; ".join(problems))
        else:
            self.report.add(OK, f"{self.label}: channel protocol",
                            f"{ch.handed} connection(s) handed, all accepted")

    def stop(self) -> None:
        """Stop order: `stop` op; close the channel; the process group must then be gone."""
        r = self._op("stop", self.svc.stop_timeout_s)
        if r.timed_out:
            self.report.add(FAIL, f"{self.label}: stop",
                            f"did not exit within stop_timeout_s ({self.svc.stop_timeout_s:g} s)")
        elif r.rc != 0:
            self.report.add(FAIL, f"{self.label}: stop", f"exit {r.rc}: {r.tail()}")
            starting.show_logs(self, self.node.data)
        else:
            self.report.add(OK, f"{self.label}: stop", f"exit 0 in {r.elapsed_s:.2f} s")
        if self.channel is not None:
            self.channel.close()
        deadline = time.monotonic() + GROUP_GONE_WAIT_S
        left = host.group_pids(self.pgid) if self.pgid else []
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = host.group_pids(self.pgid) if self.pgid else []
        if left:
            self.report.add(FAIL, f"{self.label}: process group gone",
                            f"pids {left} still running {GROUP_GONE_WAIT_S:g} s after stop "
                            f"and channel close (killed now)")
        else:
            self.report.add(OK, f"{self.label}: process group gone")

    def cleanup(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.pgid is not None:
            host.end_group(self.pgid, grace_s=1.0)
        if self.attempts is not None:
            self.attempts.close()
