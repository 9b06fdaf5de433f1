"""Runner health (G12): ``<runner.exec...> doctor --json`` (contract section 4) when a module is
loaded and at every refresh (``runningwatch``, ``--refresh-s``).

What a doctor said (``judge``, pure):

- the contract's form, ``{"runner_protocol": {"supported": [1]}, "health": ..., "checks"?:
  [{"name", "ok", "detail"?}]}``, exit 0: its ``health`` as it says. **healthy**;
  **unhealthy** (it should work here, something is broken: alert), with the failed checks as
  the reason; **undetected** (this node cannot run it: no alert, its jobs are not taken here),
  likewise. A doctor whose ``runner_protocol.supported`` lacks 1 is **undetected** on this
  agent, which speaks 1; the contract's form with a non-zero exit is **unhealthy**;
- the older form, a JSON object with ``"ok"``: ``true`` and exit 0 is **healthy**, anything
  else **unhealthy**, with the runner's own reason (its ``reason``, ``detail``, ``problems``
  or ``error``, as written);
- no answer within ``DOCTOR_TIMEOUT_S``: **unhealthy**;
- neither form (a runner that does not speak ``doctor --json``), or a doctor the sandbox could
  not start (the node's fault, not the runner's): **unknown**, the agent's own verdict: its
  jobs run, and ``status`` says its health is not known and why.

An unhealthy or undetected runner's module gets no new admissions: every job of it needs the
pseudo pool ``pool_key`` (capacity 1, 0 while unhealthy or undetected), and a job that waits
for it says the runner's reason (``wait_reason``; ``status`` and ``submit --wait`` show it).
A job submitted while the runner says undetected is refused at once (``refusal``: nothing is
queued), as a job needing a GPU API the node lacks is. Attempts already running go on. The
doctor runs like a runner (the runner's sandbox, a scratch workdir of its own under
``<state>/run/doctor/``, cwd the module's data directory, within 60 s: contract section 4), in
its own process group, ended when it is over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oarbank_agent import procs
from oarbank_agent.eventwait import result_within
from oarbank_agent.jobs import waiting
from oarbank_agent.sandbox import policy as sandboxing
from oarbank_sdk import advice, doctorform, logtail
from oarbank_sdk.protocol import last_json_object

if TYPE_CHECKING:
    from oarbank_agent.modules.loaded import ModuleCtx, NodeInfo

__all__ = ["DOCTOR_TIMEOUT_S", "HEALTHS", "HOLDS_JOBS", "RunnerHealth", "doctor", "judge",
           "pool_key", "refusal", "wait_reason"]

log = logging.getLogger("oarbank_agent.jobs.runnerhealth")

DOCTOR_TIMEOUT_S = doctorform.TIMEOUT_S
REASON_CHARS = 300  # a runner's own reason, as written
CHECK_CHARS = 240  # each failed check: every one is named, however long the others run
MAX_CHECKS = 8  # failed checks spelled out; the rest are counted
CONTRACT_HEALTHS = doctorform.HEALTHS  # what a doctor may say
HEALTHS = (*CONTRACT_HEALTHS, "unknown")  # and the agent's own: the doctor said neither form
HOLDS_JOBS = ("unhealthy", "undetected")  # no admissions while the runner is so
RUNNER_PROTOCOL = 1  # the one this agent speaks


@dataclass(frozen=True)
class RunnerHealth:
    health: str  # one of HEALTHS
    reason: str | None  # why not healthy
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


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "\u2026"


def _failed_checks_text(failed: list[str]) -> str:
    """Each failed check clipped on its own, so a long detail never hides the next check."""
    text = "; ".join(_clip(check, CHECK_CHARS) for check in failed[:MAX_CHECKS])
    if len(failed) > MAX_CHECKS:
        text += f"; and {len(failed) - MAX_CHECKS} more failed checks"
    return text


def _contract_form(rc: int, doc: dict[str, Any]) -> tuple[str, str | None]:
    """The contract's ``{"runner_protocol", "health", "checks"?}`` answer."""
    versions = doctorform.supported(doc)
    if isinstance(versions, list) and RUNNER_PROTOCOL not in versions:
        return "undetected", (f"its doctor supports runner protocol {versions}; this agent "
                              f"speaks {RUNNER_PROTOCOL}")
    health = doc["health"]
    why = _failed_checks_text(doctorform.failed_checks(doc)) or _own_reason(doc)
    if rc != 0:
        return "unhealthy", f"{why or f'doctor --json said {health}'} (exit {rc})"
    if health == "healthy":
        return "healthy", None
    return health, why or f"its doctor --json says {health} and names no failed check"


def judge(rc: int | None, doc: dict[str, Any] | None, err_tail: str,
          timeout_s: float = DOCTOR_TIMEOUT_S) -> tuple[str, str | None]:
    """(health, reason) from how ``doctor --json`` ended: ``rc`` None when it timed out,
    ``doc`` the last JSON object it printed, ``err_tail`` the end of its stderr."""
    if rc is None:
        return "unhealthy", logtail.with_summary(
            f"doctor --json did not answer within {timeout_s:g}s", err_tail)
    if doc is not None and doc.get("health") in CONTRACT_HEALTHS:
        return _contract_form(rc, doc)
    if doc is not None and doctorform.is_older_form(doc):  # still accepted
        if doc["ok"] is True and rc == 0:
            return "healthy", None
        why = _own_reason(doc) or f"doctor --json answered {json.dumps(doc)[:200]}"
        return "unhealthy", why if rc == 0 else f"{why} (exit {rc})"
    return "unknown", logtail.with_summary(
        f"doctor --json answered no JSON object with a 'health' of "
        f"{'/'.join(CONTRACT_HEALTHS)} (nor the older 'ok') (exit {rc}): its health is not "
        "checked", err_tail)


def _verdict(module_id: str, h: RunnerHealth) -> str:
    if h.health == "undetected":
        return f"the runner of module {module_id} says this node cannot run it: {h.reason}"
    return f"the runner of module {module_id} is unhealthy: {h.reason}"


def wait_reason(module_id: str, h: RunnerHealth) -> str | None:
    """Why a job of the module waits, while its runner is unhealthy or undetected; else None."""
    if h.health not in HOLDS_JOBS:
        return None
    return (f"{waiting.WAITING}{_verdict(module_id, h)} (its `doctor --json`, asked again "
            "every --refresh-s)")


def refusal(module_id: str, h: RunnerHealth | None) -> str | None:
    """Why a new job of the module is refused at submit (its runner says undetected)."""
    if h is None or h.health != "undetected":
        return None
    return f"RUNNER_UNDETECTED: {_verdict(module_id, h)} (its `doctor --json`)"


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
            proc = await procs.spawn(argv, env=env, cwd=ctx.data_dir, stdout=out,
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
        await procs.retire_group(registry, procs.group_of(proc), 1.0)  # what it left goes too
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
        return RunnerHealth("unknown", f"doctor --json could not start: {refused}", now)
    health, why = judge(rc, last_json_object(raw.decode("utf-8", errors="replace")),
                        logtail.read_tail(work / "doctor.err"), timeout_s)
    return RunnerHealth(health, why, now)
