"""Where a job stands against this node's services: which services it reserves, the admission
request it becomes, whether it can ever run here, and who uses a service.

Reads the supervisor's service table and admission's holders; changes nothing (the agent
enqueues, admits and refuses with what these return).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oarbank_agent.jobs.admission import Admission, Request
from oarbank_agent.operate import control
from oarbank_agent.services.runtime import service_key

if TYPE_CHECKING:
    from oarbank_agent.jobs.store import JobRecord
    from oarbank_agent.modules.loaded import ModuleCtx
    from oarbank_agent.services.supervisor import Supervisor
    from oarbank_sdk import manifest as mf

__all__ = ["service_keys", "request_for", "check", "service_charges", "service_gpu_charges",
           "users_of", "users"]


def service_keys(ctx: ModuleCtx, stage: mf.Stage) -> list[str]:
    """The services whose pools ``stage`` reserves, in the stage's pool order."""
    keys = []
    for pool in stage.pools:
        svc = ctx.manifest.service_for_pool(pool)
        if svc is not None and service_key(ctx.id, svc.name) not in keys:
            keys.append(service_key(ctx.id, svc.name))
    return keys


def request_for(rec: JobRecord, ctx: ModuleCtx, sup: Supervisor) -> Request:
    """The admission request of a job: its pools, the memory of the services it reserves, and
    whether it is a GPU job (it reserves a GPU service's pool)."""
    st = ctx.manifest.stage(rec.stage)
    assert st is not None
    services_mem: dict[str, float] = {}
    services_gpu: dict[str, float] = {}
    gpu: str | None = None
    for key in service_keys(ctx, st):
        rt = sup.services[key]
        if rt.svc.reserves_host_memory:
            services_mem[key] = rt.fp_reserve_gb
        if rt.fp_reserve_gpu_gb > 0:
            services_gpu[key] = rt.fp_reserve_gpu_gb
        if rt.svc.gpu.use != "none":
            # A job reserving a GPU service's pool is a GPU job.
            gpu = "exclusive" if "exclusive" in (gpu, rt.svc.gpu.use) else rt.svc.gpu.use
    return Request(
        rec.job_id, {f"{ctx.id}/{p}": n for p, n in st.pools.items()},
        tuple(f"{ctx.id}/{p}" for p in st.needs_pools), mem_gb=st.mem_gb or 0.0,
        services_mem=services_mem, services_gpu=services_gpu, gpu=gpu)


def check(ctx: ModuleCtx, st: mf.Stage, sup: Supervisor, budget_gb: float | None) -> None:
    """Refuse at once a job that can never run on this node (nothing is queued): a GPU API the
    host lacks, or more memory than the whole budget. Raises ``control.ControlError``."""
    for pool in (*st.pools, *st.needs_pools):
        svc = ctx.manifest.service_for_pool(pool)
        rt = sup.services.get(service_key(ctx.id, svc.name)) if svc else None
        if rt is not None and rt.gpu_missing is not None:
            raise control.ControlError("gpu_api_missing", rt.gpu_missing)
    need = (st.mem_gb or 0.0) + sum(
        sup.services[k].fp_reserve_gb for k in service_keys(ctx, st)
        if sup.services[k].svc.reserves_host_memory)
    if budget_gb is not None and need > budget_gb + 1e-9:
        raise control.ControlError(
            "exceeds_memory_budget",
            f"MEMORY_BUDGET: needs {need:g} GB; this node's budget is {budget_gb:g} GB")


def service_charges(sup: Supervisor) -> dict[str, float]:
    """Reserving services charge the budget while they run or have users."""
    up = ("starting", "ready", "stopping")
    return {key: rt.fp_reserve_gb for key, rt in sup.services.items()
            if rt.svc.reserves_host_memory and (rt.st.state.value in up or rt.st.users > 0)}


def service_gpu_charges(sup: Supervisor) -> dict[str, float]:
    """Services charge the GPU memory their fingerprint reserves while they run or have
    users (``reserve.gpu_mem_gb``)."""
    up = ("starting", "ready", "stopping")
    return {key: rt.fp_reserve_gpu_gb for key, rt in sup.services.items()
            if rt.fp_reserve_gpu_gb > 0 and (rt.st.state.value in up or rt.st.users > 0)}


def users_of(sup: Supervisor, admission: Admission, key: str) -> list[str]:
    """Admitted jobs holding a pool of service ``key``."""
    rt = sup.services[key]
    pools = {f"{rt.ctx.id}/{p}" for p in rt.svc.pools}
    return [r.job_id for r in admission.holding() if pools & set(r.pools)]


def users(sup: Supervisor, admission: Admission) -> dict[str, int]:
    """Service key -> tokens admitted jobs hold in its pools (its lifecycle's users)."""
    return {key: sum(admission.holders(f"{rt.ctx.id}/{p}") for p in rt.svc.pools)
            for key, rt in sup.services.items()}
