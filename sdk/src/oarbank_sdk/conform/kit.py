"""The conformance kit: ``oarbank-sdk conform MODULE_DIR [--json]`` (contract section 8).

What it does, in order, each step one or more checks (``ok``, ``FAIL``, ``skip``, ``warn``):

1. ``manifest``: ``oarbank_sdk.manifest.check`` and the page checks; nothing else runs on an
   invalid manifest. What is accepted without being acted on (``pages.module_notes``) is listed
   under the check, one note each, as ``oarbank-sdk check`` lists it.
2. ``sandbox``: ops, daemons and runners run inside ``oarbank_sdk.sandbox`` when it can confine
   them here (``warn`` and unconfined otherwise: the listen check below still runs).
   ``environment <requirements.txt>``: each module environment the ``exec`` lines use,
   installed offline from ``wheels/`` inside the sandbox as the agent installs it
   (``conform.envs``); ``python`` in that ``exec`` is then its interpreter everywhere below.
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
   ``runner spec <name>``: each ``runner_specs`` entry of ``conformance.json`` through the
   runner (fixture datasets with a ``dir`` copied in read-only), its exit code, artifacts or
   ``failure.json`` reason as ``expect`` says (``conform.runnerspecs``); every other kind of
   entry the file holds gets one line: run here, or ``skip`` naming why it has no meaning on
   this project's node (``ops``, ``params``, ``store``, ``node_classes``: a coordinator;
   ``secrets``, ``images``, ``tools``, ``net``: what this agent does not serve).
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

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from oarbank_sdk import advice
from oarbank_sdk import manifest as _manifest
from oarbank_sdk import pages as _pages
from oarbank_sdk.conform import attempts as attempts_watch
from oarbank_sdk.conform import doctor, envs, host, inputs
from oarbank_sdk.conform import start as starting
from oarbank_sdk.conform.goldens import run_goldens
from oarbank_sdk.conform.report import FAIL, OK, SKIP, WARN, Report
from oarbank_sdk.conform.runnerspecs import run_runner_specs
from oarbank_sdk.conform.service import SPECS_ATTEMPT, ServiceUnderTest, Wrap, gpu_compute
from oarbank_sdk.conform.specs import run_specs

__all__ = ["run", "sandbox_wrapper"]



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
    if sys.platform == "win32":
        report.add(FAIL if mode else WARN, "sandbox", "not run on win32: the kit's walls are "
                   "Linux's (Landlock, seccomp, namespaces) and macOS's Seatbelt; what the "
                   "Windows agent walls (job objects) is not played here: running unconfined")
        return unconfined, False
    report.add(FAIL if mode else WARN, "sandbox",
               f"unavailable on this machine ({summary}): running unconfined")
    return unconfined, False


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
    if confined and gpu_compute(m) and os.geteuid() == 0:
        report.add(WARN, "sandbox", f"{advice.GPU_UNDER_ROOT}: run conform as an ordinary user")
    watch = attempts_watch.start(confined, report)

    conf, conf_problem = inputs.settings(m.bundle)
    if conf_problem:
        report.add(FAIL, "settings", conf_problem)
    elif conf is not None:
        report.add(OK, "settings", f"{inputs.CONFORMANCE_FILE} settings ({len(conf)} key(s)) "
                   "are the services' settings file")
    node = host.NodeDirs(m.id, conf)
    node.envs = envs.install(m, node.root, wrap, report)  # python in exec: its own (section 4)
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

        doctor.check_doctor(m, node, wrap, gpu_compute(m), report)
        run_goldens(m, node, services, wrap, report)
        run_runner_specs(m, node, services, wrap, report)

        # One connection per ready service stays open through the specs: `ended` must close it.
        for name, s in services.items():
            if s.ready:
                try:
                    leftovers[name] = s.hand(SPECS_ATTEMPT)
                except OSError as exc:
                    report.add(FAIL, f"service {name}: channel", f"cannot hand a connection: {exc}")
        run_specs(m, services, report)

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
