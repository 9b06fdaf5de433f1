"""``oarbank-agent module remove ID [--now]``: a module taken off a running agent for good (G9,
with G6's ``destroy`` of what it owns).

In order:

1. It is kept as removed in ``<state>/modules.json`` first (an agent restart, even one whose
   command line names its folder, does not load it again; ``module add DIR`` does), new jobs
   for it are refused at once (``module_removed``), and its jobs that are not running fail
   with ``failure_reason`` (never silently dropped; a restarted agent fails what is left).
2. Its services are disabled (``lifecycle.set_disabled``: never started again, pools 0, a
   start in flight cancelled, a ready one stopped once it has no users). Running attempts
   finish; ``--now`` releases them instead (not charged), and a released job of a removed
   module fails like a queued one. No new attempt starts (a transient retry included).
3. Once no attempt of it runs and each service is down: ``list_owned``, then ``destroy <id>
   --force`` for every object named (``ownedwatch.destroy_all``; manual services and services
   whose GPU API is missing run no op, as everywhere else).
4. It is forgotten: its services, their rows and pools, the module itself. Its data dir
   (``<state>/modules/<id>``) is left on disk: ``module add`` of the same folder finds it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from oarbank_agent.jobs import runnerhealth
from oarbank_agent.modules import state as modulestate
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services import ownedwatch

if TYPE_CHECKING:
    from oarbank_agent.jobs.admission import Admission
    from oarbank_agent.jobs.queue import JobQueue
    from oarbank_agent.jobs.runnerhealth import RunnerHealth
    from oarbank_agent.modules.loaded import ModuleCtx
    from oarbank_agent.services.runtime import ServiceRuntime
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["Host", "failure_reason", "gone_text", "removing_text", "remove", "settled", "unload"]

log = logging.getLogger("oarbank_agent.modules.remove")

# Services in these states have no process of the agent's left (BACKOFF: a failed one that a
# disabled module never restarts).
_DOWN = (lc.State.STOPPED, lc.State.WITHDRAWN, lc.State.BACKOFF)


class Host(Protocol):
    """What a removal reads and changes: the node's module table (table.py is one)."""

    supervisor: Supervisor
    queue: JobQueue
    admission: Admission
    modules: dict[str, ModuleCtx]
    removing: dict[str, asyncio.Task[list[str]]]
    gone: dict[str, str]
    runner_health: dict[str, RunnerHealth]
    kept: modulestate.Kept
    state_dir: Path

    def service_changed(self, key: str) -> None:
        """A service's row changed (here: it is gone)."""


def failure_reason(module_id: str) -> str:
    """The reason of a job that fails because its module was removed."""
    return (f"module_removed: module {module_id} was removed from this node "
            "(oarbank-agent module remove) before this job could run")


def removing_text(module_id: str) -> str:
    return (f"module {module_id} is being removed from this node (oarbank-agent module "
            "remove): no new job is accepted")


def gone_text(module_id: str, bundle: str) -> str:
    return (f"module {module_id} was removed from this node (oarbank-agent module remove); "
            f"`oarbank-agent module add {bundle}` loads it again")


def settled(rt: ServiceRuntime) -> bool:
    """No effect in flight and nothing of it running that the agent runs."""
    return not rt.busy() and (rt.svc.lifecycle == "manual" or rt.st.state in _DOWN)


async def remove(agent: Host, ctx: ModuleCtx, now: bool) -> list[str]:
    """Steps 2-4 of the banner (the caller did step 1). Returns the problems met (each is
    also logged); the module is forgotten whatever they are."""
    sup, queue, mid = agent.supervisor, agent.queue, ctx.id
    rts = [rt for rt in sup.services.values() if rt.ctx.id == mid]
    if now:
        running = [j for j in queue.runs.tasks if queue.jobs[j].module == mid]
        queue.release(running, f"module {mid} removed (--now)")
    for rt in rts:
        sup.set_disabled(rt.key, True)
    queue.admit()
    while True:  # its runs end (released ones are failed as they come back: JobQueue)
        runs = [t for j, t in queue.runs.tasks.items() if queue.jobs[j].module == mid]
        if not runs:
            break
        await asyncio.wait(runs)
    queue.fail_unrun(mid)  # a transient retry that was not started again
    await _until_down(sup, rts)
    problems: list[str] = []
    for rt in rts:
        if rt.svc.lifecycle != "manual" and rt.gpu_missing is None:
            problems += [f"{rt.key}: {p}" for p in await ownedwatch.destroy_all(sup, rt)]
    _forget(agent, ctx, rts)
    return problems


async def _until_down(sup: Supervisor, rts: list[ServiceRuntime]) -> None:
    """Wait for each service's stop (decided by the lifecycle once it has no users)."""
    changed = asyncio.Event()

    def listener(_key: str) -> None:
        changed.set()

    sup.on_change.append(listener)
    try:
        while True:
            busy = {rt.task for rt in rts if rt.busy() and rt.task is not None}
            if busy:
                await asyncio.wait(busy)
                continue
            left = [rt for rt in rts if not settled(rt)]
            if not left:
                return
            changed.clear()
            for rt in left:
                sup.poke(rt)  # READY, no users, disabled: decide says stop
            if not any(rt.busy() for rt in left):
                await changed.wait()  # (its users leave first)
    finally:
        sup.on_change.remove(listener)


def _forget(agent: Host, ctx: ModuleCtx, rts: list[ServiceRuntime]) -> None:
    mid = ctx.id
    unload(agent, ctx, rts)
    agent.removing.pop(mid, None)
    text = gone_text(mid, str(ctx.manifest.bundle))
    agent.gone[mid] = agent.gone[ctx.manifest.short_name] = text
    # (step 1 kept it removed; a `module add` meanwhile is refused while it is removing)
    modulestate.write(agent.state_dir, agent.kept)
    log.info("module %s removed: its services stopped, what it owned destroyed; forgotten "
             "(its data dir %s is left on disk)", mid, ctx.root)


def unload(agent: Host, ctx: ModuleCtx, rts: list[ServiceRuntime]) -> None:
    """The module and its services ``rts`` (none running) taken out of the agent's tables:
    services, their rows and pools, its runner's health, the module itself."""
    sup, mid = agent.supervisor, ctx.id
    for rt in rts:
        if rt.timer is not None:
            rt.timer.cancel()
            rt.timer = None
        del sup.services[rt.key]
        for pool in rt.svc.pools:
            agent.admission.capacity.pop(f"{mid}/{pool}", None)
        agent.service_changed(rt.key)  # (the heartbeat: its rows are gone)
    agent.admission.capacity.pop(runnerhealth.pool_key(mid), None)
    agent.runner_health.pop(mid, None)
    del agent.modules[mid]
