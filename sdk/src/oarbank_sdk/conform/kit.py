"""The conformance kit: ``oarbank-sdk conform MODULE_DIR [--json]`` (contract section 8).

What it does, in order, each step one or more checks (``ok``, ``FAIL``, ``skip``, ``warn``):

1. ``manifest``: ``oarbank_sdk.manifest.check`` and the page checks; nothing else runs on an
   invalid manifest. What is accepted without being acted on (``pages.module_notes``) is listed
   under the check, one note each, as ``oarbank-sdk check`` lists it.
2. ``sandbox``: ops, daemons and runners run inside ``oarbank_sdk.sandbox`` when it can confine
   them here (``warn`` and unconfined otherwise: the listen check below still runs).
3. Each endpoint service (of the others only the fingerprint), started as the agent starts
   it (same op environment, its own process group, a channel socketpair whose child end is
   ``OARBANK_ENDPOINT_CHANNEL``): first its
   ``fingerprint`` (``pools`` keys = ``provides.pools``, service protocol 1:
   ``conform.start``); ``start`` exits 0, the hello arrives (``ready`` true before it fails
   at once; a channel closed before it says whether the daemon is gone, quoting its last log
   line), ``ready`` turns true, all within ``start_timeout_s`` (``ready`` polled from 50 ms,
   backing off to 1 s); a failing check prints the tail of the service's logs; then **no
   network attempts**: no process of the service (ops and daemon) tried ``socket``, ``bind``,
   ``listen``, ``connect`` or ``accept`` (seen by the sandbox's seccomp user notification, never in the
   service's output: ``conform.attempts``), and **never listens**: no process of the service
   holds a listening TCP/UDP/unix socket.
4. ``runner doctor``: ``doctor --json`` prints the contract's answer and exits 0
   (``conform.doctor``; the older ``{"ok": ...}`` form is a ``warn``).
5. ``golden <name>``: each ``goldens/*.json`` through the module's runner, with a connector
   this kit brokers itself; every key of ``expected.payload`` must equal the result's.
6. ``spec <name>``: each ``service_specs`` entry of ``conformance.json``, as HTTP/1.1 with
   ``Connection: close`` over a connection handed to the service; the status must match
   ``expect.status`` (default 200) and the JSON answer contain ``expect.body`` if given.
7. no network attempts and never listens again (after the requests); ``ended`` for the
   kit's attempt must close the connection it left open; every handed connection was
   ``accepted``.
8. ``stop`` exits 0, then (channel closed) the process group is gone.

Everything it starts is ended and every descriptor and temporary folder is released, whatever
fails (the node folder is kept, and named, with ``keep``). The texts that name a fix are
``oarbank_sdk.advice``'s, the agent's too. Public API: ``run(module_dir, json_output=False,
keep=False) -> int`` (0 all passed, 1 any failure).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from oarbank_sdk import _transport, advice
from oarbank_sdk import manifest as _manifest
from oarbank_sdk import pages as _pages
from oarbank_sdk.conform import attempts as attempts_watch
from oarbank_sdk.conform import doctor, expect, host, inputs
from oarbank_sdk.conform import start as starting
from oarbank_sdk.conform.listeners import listeners, related_pids, split_gpu_driver
from oarbank_sdk.conform.report import FAIL, OK, SKIP, WARN, Report
from oarbank_sdk.endpoint.service import FEATURES_ENV

__all__ = ["run", "sandbox_wrapper"]

SPECS_ATTEMPT = "conform-specs"
REQUEST_TIMEOUT_S = 30.0
ENDED_WAIT_S = 5.0
GROUP_GONE_WAIT_S = 10.0
READY_OP_TIMEOUT_S = 5.0  # contract section 2
# What the kit offers endpoint services, as an agent does (contract section 3).
OFFERED_FEATURES = "ready"

Wrap = Callable[..., list[str]]  # wrap(argv, read=..., write=..., signals=...) -> argv


def run(module_dir: str | Path, json_output: bool = False, *, sandbox: bool | None = None,
        stream: TextIO | None = None, keep: bool = False) -> int:
    """Run the kit on ``module_dir``; print a line per check and the summary (or the JSON
    report). ``sandbox``: None = use it where available, False = never (tests), True = fail
    when it is unavailable. ``keep``: leave the node folder (data, logs, attempts) in place
    and name it. Returns 1 if any check failed, else 0."""
    out = stream if stream is not None else sys.stdout
    report = Report(str(module_dir), stream=None if json_output else out)
    t0 = time.monotonic()
    try:
        _conform(Path(module_dir), report, sandbox, keep)
    except Exception as exc:  # a bug here must still end in a report, never a traceback only
        report.add(FAIL, "conform", f"internal error: {type(exc).__name__}: {exc}")
    report.wall_s = time.monotonic() - t0
    print(report.to_json() if json_output else report.summary(), file=out, flush=True)
    return 1 if report.failed else 0


# --- the sandbox seam ------------------------------------------------------------------------


def _gpu_compute(m: _manifest.Manifest) -> bool:
    """``[sandbox].devices.gpu = "compute"``: the agent grants the GPU device nodes."""
    devices = (m.sandbox or {}).get("devices") or {}
    return isinstance(devices, dict) and devices.get("gpu") == "compute"


def sandbox_wrapper(mode: bool | None, report: Report) -> tuple[Wrap, bool]:
    """How ops and runners are launched: ``(wrap, confined)``. The one place that knows about
    ``oarbank_sdk.sandbox`` (``wrap(argv, **walls) -> argv``, ``available()``,
    ``capabilities()``); the walls (``read``, ``write``, ``signals``) are the agent's: an op
    reads the bundle and the node's files and writes the module's data dir; a runner reads
    the bundle and the settings and writes its workdir."""

    def unconfined(argv: list[str], **_walls: Any) -> list[str]:
        return argv

    if mode is False:
        report.add(SKIP, "sandbox", "disabled by the caller: services and runners run unconfined")
        return unconfined, False
    try:
        from oarbank_sdk import sandbox as sb
    except ImportError as exc:
        status = FAIL if mode else WARN
        report.add(status, "sandbox", f"not installed ({exc}): running unconfined")
        return unconfined, False
    caps = sb.capabilities()
    summary = ", ".join(f"{k}={v}" for k, v in sorted(caps.items()))
    if sb.available():
        report.add(OK, "sandbox", f"enforced ({summary})")
        return sb.wrap, True
    report.add(FAIL if mode else WARN, "sandbox",
               f"unavailable on this machine ({summary}): running unconfined")
    return unconfined, False


# --- one endpoint service ----------------------------------------------------------------------


class ServiceUnderTest:
    """One endpoint service run as the agent runs it."""

    def __init__(self, m: _manifest.Manifest, svc: _manifest.Service, node: host.NodeDirs,
                 wrap: Wrap, confined: bool, report: Report, watch: bool = False) -> None:
        self.m, self.svc, self.node, self.report = m, svc, node, report
        self.wrap, self.confined = wrap, confined
        # Every launch of this service's ops with a seccomp watch (None: attempts not watched)
        self.attempts = attempts_watch.Attempts() if watch else None
        self.argv = _manifest.expand_exec(list(svc.exec), m.bundle)
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
                     self.node.tools_file],
            "write": [self.node.data], "signals": "open", "gpu": _gpu_compute(self.m)}
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
                                                      _gpu_compute(self.m))
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
        extra = (self.channel.hello_pid,) if self.channel and self.channel.hello_pid else ()
        pids = related_pids(self.pgid, extra)
        found, driver = split_gpu_driver(listeners(pids), _gpu_compute(self.m))
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


# --- goldens -----------------------------------------------------------------------------------


def _load_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except OSError as exc:
        return None, f"cannot read {path.name}: {exc}"
    except ValueError as exc:
        return None, f"{path.name} is not JSON: {exc}"


def _golden_problem(g: Any) -> str | None:
    if not isinstance(g, dict):
        return "must be a JSON object"
    for key, kind in (("name", str), ("stage", str), ("payload", dict), ("expected", dict)):
        if not isinstance(g.get(key), kind):
            return f"'{key}' must be {'a string' if kind is str else 'an object'}"
    if not isinstance(g["expected"].get("payload"), dict):
        return "'expected.payload' must be an object"
    return None


def _short(value: Any, n: int = 160) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= n else text[: n - 3] + "..."


def _run_goldens(m: _manifest.Manifest, node: host.NodeDirs, sut: dict[str, ServiceUnderTest],
                 wrap: Wrap, report: Report) -> None:
    gdir = m.bundle / "goldens"
    files = sorted(gdir.glob("*.json")) if gdir.is_dir() else []
    if not files:
        report.add(SKIP, "goldens", "no goldens/*.json")
        return
    if m.runner is None:
        report.add(FAIL, "goldens", f"{len(files)} golden(s) but the manifest has no [runner]")
        return
    runner_argv = _manifest.expand_exec(list(m.runner.exec), m.bundle)
    for i, path in enumerate(files):
        name = f"golden {path.stem}"
        g, err = _load_json(path)
        skip = None if err else inputs.upstream_golden(g)
        if skip:
            report.add(SKIP, name, f"{path.name}: {skip}")
            continue
        err = err or _golden_problem(g)
        if err:
            report.add(FAIL, name, f"{path.name}: {err}")
            continue
        stage = m.stage(g["stage"])
        if stage is None:
            report.add(FAIL, name, f"stage {g['stage']!r} is not in the manifest")
            continue
        needed = []
        for pool in stage.pools:
            svc = m.service_for_pool(pool)
            if svc is not None and svc.endpoint:
                needed.append(svc.name)
        not_ready = [s for s in needed if not (s in sut and sut[s].ready)]
        if not_ready:
            report.add(SKIP, name, f"needs service(s) {not_ready}, not ready")
            continue
        attempt = f"conform-golden-{i + 1}"
        connectors = {}
        for s in needed:
            ch = sut[s].channel
            assert ch is not None  # a ready service has its channel
            connectors[s] = host.Connector(attempt, ch)
        t0 = time.monotonic()
        try:
            walls = {"read": [m.bundle, node.settings_file],
                     "write": [node.root / "attempts" / attempt],  # <W>, made by run_runner
                     "gpu": _gpu_compute(m)}
            a = host.run_runner(wrap(runner_argv, **walls), node, attempt, stage.name,
                                g["payload"], dict(stage.pools), connectors, m.bundle,
                                stage.timeout_s, extra_env=dict(m.runner.env),
                                grace_s=m.runner.stop_grace_s)
        finally:
            # The attempt is over: close its connectors, tell every service it reached.
            for s, c in connectors.items():
                c.close()
                ch = sut[s].channel
                if ch is not None and ch.is_open:
                    ch.ended(attempt)
        elapsed = time.monotonic() - t0
        if a.rc is None:
            report.add(FAIL, name, f"runner did not finish within timeout_s ({stage.timeout_s:g} s)")
            continue
        if a.rc != 0:
            why = (f"{a.failure.get('reason')}: {a.failure.get('detail')}" if a.failure
                   else a.stderr.strip().replace("\n", " | ")[-300:])
            report.add(FAIL, name, f"runner exit {a.rc}: {why}")
            continue
        raw, err = _load_json(a.workdir / "result.json")
        problem = err or advice.envelope_problem(raw)
        if problem:
            report.add(FAIL, name, problem)
            continue
        result = raw
        diffs = []
        for key, want in g["expected"]["payload"].items():
            if key not in result["payload"]:
                diffs.append(f"payload.{key}: missing (expected {_short(want)})")
            elif result["payload"][key] != want:
                diffs.append(f"payload.{key}: expected {_short(want)}, got "
                             f"{_short(result['payload'][key])}")
        if diffs:
            report.add(FAIL, name, "; ".join(diffs))
        else:
            report.add(OK, name, f"{len(g['expected']['payload'])} key(s) match "
                       f"({a.connects} connection(s), {elapsed:.2f} s)")


# --- service specs -----------------------------------------------------------------------------


class _HandedHTTP(http.client.HTTPConnection):
    """http.client over a connection the kit handed the service."""

    def __init__(self, service: str, sock: socket.socket) -> None:
        super().__init__(service, timeout=REQUEST_TIMEOUT_S)
        self._handed: socket.socket | None = sock

    def connect(self) -> None:
        assert self._handed is not None
        self._handed.settimeout(REQUEST_TIMEOUT_S)
        self.sock, self._handed = self._handed, None


def _spec_problem(spec: Any) -> str | None:
    if not isinstance(spec, dict):
        return "must be a JSON object"
    unknown = sorted(set(spec) - {"name", "service", "method", "path", "body", "expect"})
    if unknown:
        return f"unknown key(s) {unknown}"
    for key in ("name", "service", "path"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            return f"'{key}' must be a non-empty string"
    if not spec["path"].startswith("/"):
        return "'path' must start with '/'"
    if "method" in spec and not (isinstance(spec["method"], str) and spec["method"].isalpha()):
        return "'method' must be an HTTP method like \"POST\""
    expect = spec.get("expect", {})
    if not isinstance(expect, dict) or set(expect) - {"status", "body"}:
        return "'expect' must be an object with 'status' and/or 'body'"
    status = expect.get("status", 200)
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
        return "'expect.status' must be an HTTP status (100-599)"
    return None


def _send_spec(s: ServiceUnderTest, spec: dict) -> tuple[int, bytes]:
    body = spec.get("body")
    headers = {"Connection": "close"}
    data: bytes | None = None
    if isinstance(body, str):
        data = body.encode("utf-8")
    elif body is not None:
        data = json.dumps(body).encode("utf-8")
        headers["Content-Type"] = "application/json"
    method = spec.get("method", "POST").upper()
    if data is None and method in ("POST", "PUT", "PATCH"):
        data = b""  # an explicit Content-Length: 0
    conn = _HandedHTTP(spec["service"], s.hand(SPECS_ATTEMPT))
    try:
        conn.request(method, spec["path"], body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _run_specs(m: _manifest.Manifest, sut: dict[str, ServiceUnderTest], report: Report) -> None:
    path = m.bundle / "conformance.json"
    if not path.exists():
        report.add(SKIP, "service_specs", "no conformance.json")
        return
    doc, err = _load_json(path)
    if err is None and not (isinstance(doc, dict)
                            and isinstance(doc.setdefault("service_specs", []), list)):
        # (A file with only `settings` lists no specs: that is a skip, below.)
        err = 'must be {"service_specs": [...], "settings"?: {...}}'
    if err:
        report.add(FAIL, "service_specs", f"conformance.json: {err}")
        return
    if not doc["service_specs"]:
        report.add(SKIP, "service_specs", "conformance.json lists none")
    for i, spec in enumerate(doc["service_specs"]):
        label = spec.get("name") if isinstance(spec, dict) and isinstance(spec.get("name"), str) else f"#{i}"
        name = f"spec {label}"
        problem = _spec_problem(spec)
        if problem:
            report.add(FAIL, name, f"conformance.json service_specs[{i}]: {problem}")
            continue
        s = sut.get(spec["service"])
        if s is None:
            report.add(FAIL, name, f"service {spec['service']!r} is not an endpoint service of "
                       f"the manifest")
            continue
        if not s.ready:
            report.add(SKIP, name, f"service {spec['service']!r} is not ready")
            continue
        want = spec.get("expect", {}).get("status", 200)
        method = spec.get("method", "POST").upper()
        try:
            status, body = _send_spec(s, spec)
        except (OSError, http.client.HTTPException) as exc:
            report.add(FAIL, name, f"{method} {spec['path']}: no answer ({type(exc).__name__}: {exc})")
            continue
        text = body[:200].decode("utf-8", "replace")
        want_body = spec.get("expect", {}).get("body")
        wrong_body = (expect.body_problem(want_body, body)
                      if status == want and "body" in spec.get("expect", {}) else None)
        if wrong_body:
            report.add(FAIL, name, f"{method} {spec['path']} -> {status}, but {wrong_body}")
        elif status == want:
            report.add(OK, name, f"{method} {spec['path']} -> {status}"
                       + (" with the expected body" if want_body is not None else ""))
        else:
            report.add(FAIL, name, f"{method} {spec['path']}: expected status {want}, got "
                       f"{status}: {text}")


# --- the whole run -----------------------------------------------------------------------------


def _conform(module_dir: Path, report: Report, sandbox: bool | None, keep: bool) -> None:
    m, problems = _manifest.check(module_dir)
    if m is None or problems:
        toml = module_dir / "oarbank-module.toml" if module_dir.is_dir() else module_dir
        report.add(FAIL, "manifest", "; ".join(f"{toml}: {p.key}: {p.message}" for p in problems))
        return
    report.module_id, report.version = m.id, m.version
    # The same page checks as `oarbank-sdk check`: the kit must never pass what check rejects.
    page_problems = _pages.check_module_pages(m)
    if page_problems:
        report.add(FAIL, "manifest", "; ".join(f"{p.key}: {p.message}" for p in page_problems))
    else:
        report.add(OK, "manifest", f"{m.id} {m.version}")
        # What is accepted without being acted on, said once each, as `check` says it.
        report.note([f"note {n.key}: {n.message}" for n in _pages.module_notes(m)])
    wrap, confined = sandbox_wrapper(sandbox, report)
    if confined and _gpu_compute(m) and os.geteuid() == 0:
        report.add(WARN, "sandbox", f"{advice.GPU_UNDER_ROOT}: run conform as an ordinary user")
    watch = attempts_watch.start(confined, report)

    conf, conf_problem = inputs.settings(m.bundle)
    if conf_problem:
        report.add(FAIL, "settings", conf_problem)
    elif conf is not None:
        report.add(OK, "settings", f"{inputs.CONFORMANCE_FILE} settings ({len(conf)} key(s)) "
                   "are the services' settings file")
    node = host.NodeDirs(m.id, conf)
    services: dict[str, ServiceUnderTest] = {}
    leftovers: dict[str, socket.socket] = {}
    try:
        for svc in m.services:
            if not svc.endpoint:
                # Not started here, but its fingerprint gates its pools on a node all the same.
                other = ServiceUnderTest(m, svc, node, wrap, confined, report, watch)
                try:
                    starting.check_fingerprint(other, svc.pools)
                finally:
                    other.cleanup()
                report.add(SKIP, f"service {svc.name}", "not an endpoint service: not started")
                continue
            s = services[svc.name] = ServiceUnderTest(m, svc, node, wrap, confined, report, watch)
            s.start()
        if not services:
            report.add(SKIP, "services", "no endpoint service to start")

        doctor.check_doctor(m, node, wrap, _gpu_compute(m), report)
        _run_goldens(m, node, services, wrap, report)

        # One connection per ready service stays open through the specs: `ended` must close it.
        for name, s in services.items():
            if s.ready:
                try:
                    leftovers[name] = s.hand(SPECS_ATTEMPT)
                except OSError as exc:
                    report.add(FAIL, f"service {name}: channel", f"cannot hand a connection: {exc}")
        _run_specs(m, services, report)

        for name, s in services.items():
            if not s.ready:
                continue
            s.check_listening("after requests")
            s.check_ended(leftovers.get(name))
            s.check_channel()
        for s in services.values():
            if s.pgid is not None and s.ready:
                s.stop()
    finally:
        for sock in leftovers.values():
            sock.close()
        for s in services.values():
            s.cleanup()
        if keep:
            report.note([f"kept the node folder: {node.root} (the module's data folder: "
                         f"{node.data}; each op's output: {node.root / 'ops'})"])
        else:
            node.cleanup()
