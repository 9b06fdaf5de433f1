"""One attempt of a job: the runner protocol (contract section 4), effects only.

argv ``<runner.exec...> run --spec <W>/spec.json --workdir <W> --out <W>/result.json`` (and
``--events <W>/events.ndjson`` for a runner that declares it: runnerevents.py), the
exact environment (nothing else inherited), its own process group, a connector per endpoint
service whose pool the stage reserves, ``timeout_s`` -> the group asked to stop, killed after
``stop_grace_s``. At the end: the group is ended, then the broker ends the attempt (connectors
closed, ``ended`` sent to every service it reached). ``classify`` (pure) maps the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oarbank_agent import platform, procs
from oarbank_agent.eventwait import result_within
from oarbank_agent.jobs import runnerevents
from oarbank_agent.modules import compat
from oarbank_agent.modules.loaded import ModuleCtx, NodeInfo
from oarbank_agent.sandbox import escapewatch, resourcelimits
from oarbank_agent.sandbox import policy as sandboxing
from oarbank_agent.services.runtime import service_key
from oarbank_sdk import advice, environments, logtail
from oarbank_sdk import manifest as mf
from oarbank_sdk.protocol import current_transport

if TYPE_CHECKING:
    from oarbank_agent.broker.handover import Broker
    from oarbank_agent.jobs.controlio import AttemptControl

__all__ = ["Outcome", "classify", "runner_env", "run_attempt", "EXIT_JOB", "EXIT_HOST",
           "EXIT_TRANSIENT"]

EXIT_JOB = 2  # the spec can never succeed: not retried
EXIT_HOST = 3  # a node dependency is missing
EXIT_TRANSIENT = 75  # retried


@dataclass(frozen=True)
class Outcome:
    state: str  # succeeded | failed | retry
    exit_code: int | None
    reason: str | None
    result: dict[str, Any] | None = None
    fault: str | None = None  # job | host | transient


def _read_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except FileNotFoundError:
        return None, f"{path.name} is missing"
    except (OSError, ValueError) as exc:
        return None, f"{path.name} is unreadable ({exc})"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # missing: _read_json says so


def _with_log(reason: str, workdir: Path) -> str:
    """``reason: <last meaningful line of runner.log>`` (bounded read, at most 300 chars)."""
    return logtail.with_summary(reason, logtail.read_tail(workdir / "runner.log"))


def classify(rc: int, timed_out: bool, workdir: Path, timeout_s: float,
             max_inline_kb: float = advice.RESULT_INLINE_KB) -> Outcome:
    """Map how a runner ended to the attempt's outcome (contract section 4). A failure that
    no failure.json explains ends with the last meaningful line of ``runner.log``. A
    ``result.json`` over ``max_inline_kb`` is not read (the job record and every status and
    wait answer carry the result): a job fault naming its size."""
    if timed_out:
        return Outcome("failed", rc, f"timeout: the runner exceeded timeout_s={timeout_s:g}",
                       fault="job")
    if rc == 0:
        size = _size(workdir / "result.json")
        if size > max_inline_kb * 1024:
            return Outcome("failed", 0, advice.result_too_big(size, max_inline_kb),
                           fault="job")
        result, err = _read_json(workdir / "result.json")
        err = err or advice.envelope_problem(result)  # conform's words
        if err is None:
            return Outcome("succeeded", 0, None, result)
        return Outcome("failed", 0, f"exit 0 without a valid result.json: {err}")
    if rc in (EXIT_JOB, EXIT_HOST, EXIT_TRANSIENT):
        failure, err = _read_json(workdir / "failure.json")
        if err is None and isinstance(failure, dict):
            what = str(failure.get("reason") or "unspecified")
            detail = failure.get("detail")
            reason = f"{what}: {detail}" if detail else what
            fault = {EXIT_JOB: "job", EXIT_HOST: "host", EXIT_TRANSIENT: "transient"}[rc]
            return Outcome("retry" if rc == EXIT_TRANSIENT else "failed", rc, reason,
                           fault=fault)
        return Outcome("failed", rc, _with_log(
            f"runner exited with {rc} but {err or 'failure.json is not an object'}", workdir))
    if rc < 0:
        return Outcome("failed", rc, _with_log(f"runner killed by signal {-rc}", workdir))
    return Outcome("failed", rc, _with_log(f"runner exited with {rc}", workdir))


def runner_env(ctx: ModuleCtx, node: NodeInfo, stage: mf.Stage, attempt_id: str,
               workdir: Path) -> dict[str, str]:
    """The contract's runner environment, without the connectors (added per service)."""
    return environments.runner_env(
        module=ctx.id, attempt_id=attempt_id, workdir=workdir, data_dir=ctx.data_dir,
        platform=node.platform, settings_file=ctx.settings_file, pools=stage.pools,
        manifest_env=ctx.manifest.runner.env if ctx.manifest.runner else None)


def endpoint_services(ctx: ModuleCtx, stage: mf.Stage) -> list[mf.Service]:
    """Endpoint services of the same module whose pools the stage reserves (needs_pools
    gives none)."""
    out: list[mf.Service] = []
    for pool in stage.pools:
        svc = ctx.manifest.service_for_pool(pool)
        if svc is not None and svc.endpoint and svc not in out:
            out.append(svc)
    return out


async def run_attempt(ctx: ModuleCtx, node: NodeInfo, stage: mf.Stage, *, job_id: str,
                      payload: dict[str, Any], attempt_id: str, workdir: Path, broker: Broker,
                      registry: procs.ProcessRegistry,
                      on_spawned: Callable[[], None] | None = None,
                      control: AttemptControl | None = None,
                      resume: dict[str, Any] | None = None) -> Outcome:
    """Run one attempt to its end. On cancellation the attempt is ended (group, connectors,
    ``ended``) before CancelledError propagates. ``on_spawned``: called once the runner is
    started (what the caller writes then is off the path to the runner's exec). ``control``:
    the runner accepts the control document (written before it starts, ``controlio.py``);
    ``resume``: the spec's ``resume`` (its checkpoint is in ``<W>/checkpoint/`` already)."""
    with broker.attempt(attempt_id):  # ends it (connectors closed, `ended`) on every path
        return await _run(ctx, node, stage, job_id=job_id, payload=payload,
                          attempt_id=attempt_id, workdir=workdir, broker=broker,
                          registry=registry, on_spawned=on_spawned, control=control,
                          resume=resume)


async def _run(ctx: ModuleCtx, node: NodeInfo, stage: mf.Stage, *, job_id: str,
               payload: dict[str, Any], attempt_id: str, workdir: Path, broker: Broker,
               registry: procs.ProcessRegistry,
               on_spawned: Callable[[], None] | None, control: AttemptControl | None,
               resume: dict[str, Any] | None) -> Outcome:
    """``run_attempt`` inside the attempt's broker lifetime."""
    runner = ctx.manifest.runner
    if runner is None:  # (the caller may have named the attempt: wire_attempt)
        return Outcome("failed", None, f"module {ctx.id} declares no [runner]", fault="job")
    # Two plain makedirs, not three Path.mkdir: this is on the way to the runner's fork.
    os.makedirs(workdir / "tmp", exist_ok=True)
    os.makedirs(workdir / "home", exist_ok=True)
    spec = {"job_id": job_id, "attempt_id": attempt_id, "stage": stage.name, "payload": payload}
    if resume is not None:
        spec["resume"] = resume
    (workdir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")  # no indent: C encoder
    argv = ctx.exec_argv(runner.exec) + [
        "run", "--spec", str(workdir / "spec.json"), "--workdir", str(workdir),
        "--out", str(workdir / "result.json")]
    if runnerevents.declared(ctx.manifest):  # [runner].capabilities lists "events"
        argv += runnerevents.argv(workdir)
    env = runner_env(ctx, node, stage, attempt_id, workdir)
    # requires.resources as the attempt group's memory.max / cpu.max, where enforced here
    limits = resourcelimits.current().files_for(stage.mem_gb, stage.cpu)
    inherit: list[int] = []
    transport = current_transport()
    proc = None
    try:
        # {"seq": 0} before the runner looks, and how it is nudged (what the platform's nudge
        # passes it: variables, inherited handles); ended() below closes what the nudge holds
        nudge = control.open() if control is not None else None
        if nudge is not None:
            env.update(nudge.env)
            inherit.extend(nudge.inherit)
        for svc in endpoint_services(ctx, stage):
            fd = broker.open_connector(attempt_id, service_key(ctx.id, svc.name))
            env[svc.env_name] = transport.format(fd)  # the connector's child end
            inherit.append(fd)
        with open(workdir / "runner.log", "ab") as log:
            try:
                proc = await procs.spawn(argv, env=env, cwd=workdir, stdout=log, stderr=log,
                                         inherit=tuple(inherit), registry=registry,
                                         kind="runner", label=attempt_id,
                                         walls=sandboxing.runner_walls(ctx, workdir),
                                         refusal_key=attempt_id, limits=limits)
            except OSError as exc:
                return Outcome("failed", None, f"cannot start the runner {argv[0]}: {exc}",
                               fault="host")
            finally:
                broker.close_child_ends(attempt_id)  # only the runner holds them now
                if nudge is not None:
                    nudge.spawned()
        broker.own(attempt_id, procs.group_of(proc).owns)  # a connect's pid is checked by it
        if control is not None:
            running = proc
            control.started(proc.pid, lambda: running.returncode is None)
        if on_spawned is not None:
            on_spawned()
        timed_out = False
        # Not wait_for: on Python < 3.12 it may swallow a cancel (agent shutdown) that comes
        # in the turn the runner exits (eventwait.py).
        exited, rc = await result_within(proc.wait(), stage.timeout_s)
        if not exited:
            # running -> stopping (timeout_s): the group asked to stop, killed after stop_grace_s
            timed_out = True
            rc = await _terminate(proc, runner.stop_grace_s)
        assert rc is not None
        # Exit 70/71 with the launcher's line: the sandbox refused and the runner never ran
        # (not the runner's own failure, and never retried: the node cannot confine it).
        refused = None if timed_out else sandboxing.launcher_failure(
            rc, logtail.read_tail(workdir / "runner.log"))
        if refused is not None:
            return Outcome("failed", rc, refused, fault="host")
        group = procs.group_of(proc)
        escaped = escapewatch.take(group)  # the escape check ended the group: not the job's doing
        if escaped is not None:
            return Outcome("failed", rc, escaped, fault="job")
        outcome = classify(rc, timed_out, workdir, stage.timeout_s,
                           compat.max_inline_kb(ctx.manifest))
        # Read before the attempt's group is ended: the OOM killer at its memory.max.
        oom = (resourcelimits.oom_fault(group, stage.mem_gb) if "memory.max" in limits
               else None)
        if oom is not None and outcome.state != "succeeded":
            return Outcome("failed", rc, oom, fault="job")
        return outcome
    except asyncio.CancelledError:
        # Agent shutdown: end the attempt the same way as a timeout.
        if proc is not None and proc.returncode is None:
            await _terminate(proc, runner.stop_grace_s)
        raise
    finally:
        if control is not None:
            control.ended()
        if proc is not None:
            # Attempt over: whatever the runner left in its group goes too, then `ended`
            # (on leaving run_attempt's `with broker.attempt`).
            await procs.retire_group(registry, procs.group_of(proc), runner.stop_grace_s)


async def _terminate(proc: procs.ChildProcess, grace_s: float) -> int:
    group = procs.group_of(proc)
    group.terminate()
    exited, rc = await result_within(proc.wait(), grace_s)
    if exited and rc is not None:
        return rc
    group.kill()
    with contextlib.suppress(ProcessLookupError):
        return await proc.wait()
    return platform.current().groups.killed_returncode
