"""The node as a claim describes it (``offer.NodeView``), read from the agent's parts: the
supervisor's services (state, pool capacities, measured load times, reserves), admission
(tokens held and asked for, the memory budget and what is charged), demand eviction (what it
could free), the GPUs NVML reads, and the modules that take jobs now. Reads only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oarbank_agent.host import memory
from oarbank_agent.jobs import placement, runnerhealth
from oarbank_agent.modules import compat
from oarbank_agent.services import lifecycle as lc

from .offer import JobTimes, ModuleView, NodeView, ServiceView

if TYPE_CHECKING:
    from oarbank_agent.agent import Agent
    from oarbank_agent.modules.loaded import ModuleCtx
    from oarbank_agent.services.runtime import ServiceRuntime

__all__ = ["node_view", "offered_modules"]

_GB = 2**30


def _state(rt: ServiceRuntime) -> str:
    if rt.st.state is lc.State.READY and rt.st.evict_for is None and lc.offered(rt.st):
        return "ready"
    if rt.st.state is lc.State.STARTING and lc.offered(rt.st):
        return "starting"
    return "stopped"


def offered_modules(agent: Agent) -> list[ModuleCtx]:
    """The modules whose jobs this node takes now: loaded, not disabled or being removed,
    their runner not refusing (a job the node would refuse is not claimed)."""
    return [ctx for ctx in agent.modules.values()
            if ctx.id not in agent.disabled and ctx.id not in agent.removing
            and runnerhealth.refusal(ctx.id, agent.runner_health.get(ctx.id)) is None]


def _service(agent: Agent, rt: ServiceRuntime, asked: dict[str, int]) -> ServiceView:
    adm = agent.admission
    pools = {}
    for pool, total in agent.supervisor.capacities(rt.key).items():
        k = f"{rt.ctx.id}/{pool}"
        pools[pool] = (max(0, total - adm.in_use.get(k, 0) - asked.get(k, 0)), total)
    return ServiceView(rt.svc.name, _state(rt), pools, agent.supervisor.stats.load_s(rt.key),
                       rt.fp_reserve_gb if rt.fp_reserve_gb > 0 else None)


def _free_mem_gb(agent: Agent) -> float | None:
    adm = agent.admission
    if adm.budget_gb is not None:
        return max(0.0, adm.budget_gb - adm.charged_gb())
    try:
        return memory.total_bytes() * memory.available_fraction() / _GB
    except Exception:  # unknown here: the portal reads null as "fits"
        return None


def node_view(agent: Agent, times: JobTimes) -> NodeView:
    asked = agent.admission.queued_tokens()
    modules = []
    for ctx in offered_modules(agent):
        stages = [st for st in ctx.manifest.stages
                  if compat.stage_refusal(ctx.manifest, st, agent.compat.platform) is None]
        keys = {k for st in stages for k in placement.service_keys(ctx, st)}
        services = tuple(_service(agent, agent.supervisor.services[k], asked)
                         for k in sorted(keys) if k in agent.supervisor.services)
        modules.append(ModuleView(
            ctx.id, tuple(st.name for st in stages), services, times.mean(ctx.id),
            tuple(st.name for st in stages if not st.pools)))
    gpu = agent.gpu_memory.read()
    return NodeView(
        agent.node.node_id, tuple(modules), _free_mem_gb(agent),
        agent.evictor.evictable().get("mem_gb", 0.0),
        tuple({"index": g.get("index"), "mem_used_gb": round(g["used_bytes"] / _GB, 3),
               "mem_total_gb": round(g["total_bytes"] / _GB, 3)} for g in gpu.gpus),
        len(agent.admission.waiting()), agent.stopping())
