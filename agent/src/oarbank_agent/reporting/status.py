"""What the node reports: ``report`` (every heartbeat, and the start of ``status``) and
``status`` (the report with jobs, a page of them, and node details), read from the agent's
parts through ``StatusSource``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from oarbank_agent import factory, platform, recovery
from oarbank_agent.host import memory
from oarbank_agent.jobs import machine as jobs
from oarbank_agent.jobs import waiting
from oarbank_agent.sandbox import containment, refusals, resourcelimits
from oarbank_agent.sandbox import policy as sandboxing
from oarbank_agent.services.runtime import details as supervisor_details

if TYPE_CHECKING:
    from pathlib import Path

    from oarbank_agent.host import gpuapis, gpumem
    from oarbank_agent.jobs.admission import Admission
    from oarbank_agent.jobs.runnerhealth import RunnerHealth
    from oarbank_agent.jobs.store import JobRecord
    from oarbank_agent.modules import compat
    from oarbank_agent.modules.loaded import ModuleCtx, NodeInfo
    from oarbank_agent.protection.guard import Guard
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["StatusSource", "report", "status", "with_wait"]


class StatusSource(Protocol):
    """The parts of the agent a report reads (the agent is one)."""

    node: NodeInfo
    compat: compat.Node
    supervisor: Supervisor
    runner_health: dict[str, RunnerHealth]
    modules: dict[str, ModuleCtx]
    jobs: dict[str, JobRecord]
    state_dir: Path
    refused_modules: dict[str, str]
    guard: Guard
    admission: Admission
    fault: str | None
    heartbeat: Any
    fleet: Any
    gpu_memory: gpumem.Reader

    @property
    def gpu(self) -> gpuapis.Detection | None: ...


def report(agent: StatusSource) -> dict[str, Any]:
    doc = _report(agent)
    _add_metrics(doc, agent)
    # module -> {requirements file: the environment its `python` is (modules/envs.py)}
    doc["module_envs"] = {ctx.id: ctx.env_report() for ctx in agent.modules.values()}
    return doc


def _add_metrics(doc: dict[str, Any], agent: StatusSource) -> None:
    """What the portal's ``nodes`` and ``node_metrics`` queries read (ui-pages heartbeat.py):
    the node's memory in use and in total, what running services reserve (admission's
    charges), and on each service row its resident memory (its group's, while it runs) and
    how many times this agent started it. GPU memory (NVML: host/gpumem.py): each GPU's used
    and total, and per service what its processes hold where the driver says; unknown is null
    with ``gpu_mem_error`` saying why, never zero. What cannot be read is null, never a failed
    heartbeat."""
    runtimes = list(agent.supervisor.services.values())
    groups = [rt.group for rt in runtimes if rt.group is not None]
    try:
        rss = platform.current().groups.resident(groups) if groups else {}
    except Exception:  # a group gone between listing and reading: no figure this time
        rss = {}
    gpu = agent.gpu_memory.read()
    for row, rt in zip(doc["services"], runtimes, strict=True):
        held = rss.get(rt.group) if rt.group is not None and row.get("running") else None
        row["rss_bytes"] = int(held) if held is not None else None
        row["loads"] = rt.starts
        row["gpu_mem_bytes"] = (gpu.held_by(set(rt.group.members()))
                                if rt.group is not None and row.get("running") else None)
    try:
        total = memory.total_bytes()
        used: int | None = int(total * (1.0 - memory.available_fraction()))
    except Exception:
        total, used = 0, None
    reserved = sum(agent.admission.service_charges.values())
    doc["metrics"] = {"mem_used_bytes": used, "mem_reserved_bytes": int(reserved * 2**30),
                      "mem_total_bytes": total or None, "gpu_mem_used_bytes": gpu.used_bytes,
                      "gpu_mem_total_bytes": gpu.total_bytes, "gpu_mem_error": gpu.error,
                      "gpus": gpu.gpus, "gpu_mem_reserved_bytes": int(
                          sum(agent.admission.service_gpu_charges.values()) * 2**30)}


def _report(agent: StatusSource) -> dict[str, Any]:
    return {"node_id": agent.node.node_id, "hostname": agent.node.hostname,
            "time": time.time(),
            # what a module's [requires] is matched against here (compat.py)
            "agent_version": agent.compat.agent, "core_version": agent.compat.core,
            "platform": agent.compat.platform,
            "services": [agent.supervisor.row(rt) for rt in agent.supervisor.services.values()],
            # node-level: what confines every job and service here (measured, see sandboxing)
            "sandbox": sandboxing.current().report(),
            # network attempts the sandbox refused, per service / attempt (refusals.py);
            # "counted" false: refused all the same, but this machine cannot count them
            "sandbox_refusals": refusals.current().report(),
            "sandbox_refusals_counted": refusals.current().enabled,
            # each runner's `doctor --json` verdict (runnerhealth.py): in every heartbeat,
            # so that a fleet sees an unhealthy runner, not only this node's `status`
            "runners": {m: h.report() for m, h in agent.runner_health.items()}}


def with_wait(agent: StatusSource, rec: JobRecord, view: dict[str, Any]) -> dict[str, Any]:
    """A job's view; an admitted job waiting for a starting service says so, with the
    seconds spent and allowed, or for a restart after a failed start, with the failure and
    the seconds to the next start (computed now: it is never stored)."""
    ctx = agent.modules.get(rec.module)
    stage = ctx.manifest.stage(rec.stage) if ctx else None
    if rec.state == jobs.State.ADMITTED.value and not view.get("reason") and ctx and stage:
        view["reason"] = waiting.admitted_wait_reason(agent.supervisor, ctx, stage,
                                                      time.monotonic(), time.time())
    return view


def status(agent: StatusSource, jobs_limit: int | None = None, jobs_page: int = 1) -> dict[str, Any]:
    """The report with jobs and node details. ``jobs_limit``: a page of that many jobs,
    page 1 the most recent (each page in submission order); None: every job."""
    rep = report(agent)
    now = time.time()
    for r, rt in zip(rep["services"], agent.supervisor.services.values(), strict=True):
        r.update(supervisor_details(rt, now))  # pid, uptime, idle stop, restarts
    ordered = sorted(agent.jobs.values(), key=lambda r: (r.submitted_at, r.seq))
    rep["jobs_total"] = len(ordered)
    # Jobs an agent restart touched: an attempt's outcome collected (its runner had finished),
    # or an interrupted attempt run again. Not in the heartbeat: contract section 6 has no
    # job fields (the portal reports services), so it stays here, in `status` and its JSON.
    rep["jobs_after_restart"] = recovery.after_restart(ordered)
    if jobs_limit is not None:
        end = max(0, len(ordered) - jobs_limit * (jobs_page - 1))
        ordered = ordered[max(0, end - jobs_limit):end]
        rep["jobs_page"] = {"page": jobs_page, "per_page": jobs_limit,
                            "pages": max(1, -(-rep["jobs_total"] // jobs_limit))}
    rep["jobs"] = [with_wait(agent, r, r.summary()) for r in ordered]
    rep["state_dir"] = str(agent.state_dir)
    rep["modules_refused"] = dict(agent.refused_modules)  # module -> why it is not running
    rep["gpu"] = agent.gpu.as_dict() if agent.gpu is not None else None
    rep["protection"] = agent.guard.report(agent.admission.budget_gb,
                                          agent.admission.charged_gb())
    rep.update(containment.current().report())  # its mode, and why
    # requires.resources as memory.max / cpu.max: enforced, or unavailable and why
    rep["resource_limits"] = resourcelimits.current().report()
    rep["fault"] = agent.fault  # test-only fault injection: never on silently
    rep["process_factory"] = factory.report()  # on/off; its pid, RSS, descriptors
    # what the portal did with this node's reports (refusals by cause: heartbeat.py)
    rep["heartbeat"] = agent.heartbeat.status() if agent.heartbeat is not None else None
    # fleet dispatch (--claim): claims, leases held and lost, results owed and refused
    rep["fleet"] = agent.fleet.status() if agent.fleet is not None else None
    return rep
