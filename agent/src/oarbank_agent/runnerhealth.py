"""Runner health (G12): ``<runner.exec...> doctor --json`` (contract section 4) when a module is
loaded and at every refresh (``runningwatch``, ``--refresh-s``).

What a doctor said (``judge``, pure):

- a JSON object with ``"ok": true`` and exit 0: **healthy**;
- a JSON object with ``"ok"`` anything else, or exit non-zero with such an object, or no
  answer within ``DOCTOR_TIMEOUT_S``: **unhealthy**, with the runner's own reason (its
  ``reason``, ``detail``, ``problems`` or ``error``, as written);
- no JSON object with an ``ok`` at all (a runner that does not speak ``doctor --json``), or a
  doctor the sandbox could not start (the node's fault, not the runner's): **undetected**,
  as a fingerprint's ``undetected`` health: its jobs run, and ``status`` says its health is
  not known and why.

An unhealthy runner's module gets no new admissions: every job of it needs the pseudo pool
``pool_key`` (capacity 1, 0 while unhealthy), and a job that waits for it says the runner's
reason (``wait_reason``; ``status`` and ``submit --wait`` show it). Attempts already running
go on. The doctor runs like a runner (the runner's sandbox, a scratch workdir of its own under
``<state>/run/doctor/``, cwd the bundle), in its own process group, ended when it is over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oarbank_sdk import advice
from oarbank_sdk.protocol import last_json_object

from . import logtail, procs, sandboxing, waiting
from .eventwait import result_within

if TYPE_CHECKING:
    from .modules import ModuleCtx, NodeInfo

__all__ = ["DOCTOR_TIMEOUT_S", "RunnerHealth", "doctor", "judge", "pool_key", "wait_reason"]

log = logging.getLogger("oarbank_agent.runnerhealth")

DOCTOR_TIMEOUT_S = 10.0  # the contract gives none; an interpreter start under load fits
REASON_CHARS = 300


@dataclass(frozen=True)
class RunnerHealth:
    health: str  # healthy | unhealthy | undetected
    reason: str | None  # why unhealthy or undetected
    checked_at: float  # unix time of the doctor run

    def report(self) -> dict[str, Any]:
        return {"health": self.health, "reason": self.reason, "checked_at": self.checked_at}


def pool_key(module_id: str) -> str:
    """The admission pseudo pool every job of the module needs (no pool name has a colon)."""
    return f"{module_id}/:runner"


def _own_reason(doc: dict[str, Any]) -> str | None:
    parts = []
    for key in ("reason", "detail", "problems", "error"):
        v = doc.get(key)
        if isinstance(v, list):
            v = "; ".join(str(x) for x in v)
        if isinstance(v, (str, int, float)) and str(v):
            parts.append(str(v))
    text = ": ".join(parts)
    return text[:REASON_CHARS] if text else None


def judge(rc: int | None, doc: dict[str, Any] | None, err_tail: str,
          timeout_s: float = DOCTOR_TIMEOUT_S) -> tuple[str, str | None]:
    """(health, reason) from how ``doctor --json`` ended: ``rc`` None when it timed out,
    ``doc`` the last JSON object it printed, ``err_tail`` the end of its stderr."""
    if rc is None:
        return "unhealthy", logtail.with_summary(
            f"doctor --json did not answer within {timeout_s:g}s", err_tail)
    if doc is not None and "ok" in doc:
        if doc["ok"] is True and rc == 0:
            return "healthy", None
        why = _own_reason(doc) or f"doctor --json answered {json.dumps(doc)[:200]}"
        return "unhealthy", why if rc == 0 else f"{why} (exit {rc})"
    return "undetected", logtail.with_summary(
        f"doctor --json answered no JSON object with 'ok' (exit {rc}): its health is not "
        "checked", err_tail)


def wait_reason(module_id: str, h: RunnerHealth) -> str | None:
    """Why a job of the module waits, while its runner is unhealthy; else None."""
    if h.health != "unhealthy":
        return None
    return (f"{waiting.WAITING}the runner of module {module_id} is unhealthy: {h.reason} (its "
            "`doctor --json`, asked again every --refresh-s)")


async def doctor(ctx: ModuleCtx, node: NodeInfo, registry: procs.ProcessRegistry,
                 timeout_s: float = DOCTOR_TIMEOUT_S) -> RunnerHealth:
    """Run the module's ``doctor --json`` once. Never raises for the runner's failures."""
    runner = ctx.manifest.runner
    assert runner is not None
    work = node.state_dir / "run" / "doctor" / ctx.id
    shutil.rmtree(work, ignore_errors=True)  # each run starts from nothing
    for d in (work, work / "tmp", work / "home"):
        d.mkdir(parents=True, exist_ok=True)
    env = dict(runner.env)
    env.update({"OARBANK_WORKDIR": str(work), "OARBANK_TMP": str(work / "tmp"),
                "TMPDIR": str(work / "tmp"), "OARBANK_MODULE_DATA": str(ctx.data_dir),
                "OARBANK_PLATFORM": node.platform, "OARBANK_MODULE": ctx.id,
                "OARBANK_PROTOCOL": "1", "OARBANK_SETTINGS_FILE": str(ctx.settings_file),
                "PYTHONUTF8": "1", "HOME": str(work / "home")})
    argv = ctx.exec_argv(runner.exec) + ["doctor", "--json"]
    now = time.time()
    with open(work / "doctor.out", "wb") as out, open(work / "doctor.err", "wb") as err:
        try:
            proc = await procs.spawn(argv, env=env, cwd=ctx.manifest.bundle, stdout=out,
                                     stderr=err, registry=registry, kind="op",
                                     label=f"{ctx.id} runner doctor",
                                     walls=sandboxing.runner_walls(ctx, work),
                                     refusal_key=f"{ctx.id} runner doctor")
        except OSError as exc:
            return RunnerHealth("unhealthy", f"doctor --json: cannot run {argv[0]}: {exc}", now)
    # Not wait_for: on Python < 3.12 it may swallow a cancel that comes in the turn the
    # doctor exits (eventwait.py), and the refresh task would never end.
    try:
        _, rc = await result_within(proc.wait(), timeout_s)
    finally:
        await procs.retire_group(registry, proc.pid, 1.0)  # what it left goes too
    if rc is None:
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()  # (reaped: its group was ended)
    with open(work / "doctor.out", "rb") as f:
        raw = f.read(advice.OP_STDOUT_MAX)  # bounded, as an op's stdout
    refused = sandboxing.launcher_failure(rc, logtail.read_tail(work / "doctor.err")) \
        if rc is not None else None
    if refused is not None:
        # The node's sandbox failed, not the runner: no verdict on the runner. Its jobs are
        # not held back; each fails with this same sandbox reason, as without a doctor.
        return RunnerHealth("undetected", f"doctor --json could not start: {refused}", now)
    health, why = judge(rc, last_json_object(raw.decode("utf-8", errors="replace")),
                        logtail.read_tail(work / "doctor.err"), timeout_s)
    return RunnerHealth(health, why, now)
