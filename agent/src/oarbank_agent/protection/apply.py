"""What the agent does with host protection's actions (guard.py decides, this applies them, in
their order), and what protection sets up at start: the GPU placement (a service whose
``apis_any`` the host lacks is not offered here), the memory budget, the host rules kept from
before a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from oarbank_agent.host import gpuapis, gpumem, memory
from oarbank_agent.protection import decisions as protection
from oarbank_agent.protection import hostrules
from oarbank_agent.protection.guard import (
    DEFAULT_BUDGET_FRACTION,
    Action,
    Admit,
    AllowGpu,
    Guard,
    GuardConfig,
    Hold,
    HoldRunners,
    Pause,
    ReleaseGpuJobs,
    ReleaseJobs,
)

if TYPE_CHECKING:
    from pathlib import Path

    from oarbank_agent.jobs.admission import Admission
    from oarbank_agent.jobs.queue import JobQueue
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["apply", "gpu_budget_gb", "memory_budget_gb", "place_gpu_services",
           "restore_rules"]

log = logging.getLogger("oarbank_agent")


async def place_gpu_services(supervisor: Supervisor,
                             gpu: gpuapis.Detection | None) -> gpuapis.Detection:
    """GPU APIs (detected, each probe under a watchdog, unless overridden): a service
    whose ``apis_any`` the host lacks is not offered here (its pools do not exist). Returns
    what was detected (or the override)."""
    if gpu is None:
        gpu = await asyncio.to_thread(gpuapis.detect)
    log.info("GPU APIs (%s): %s", gpu.source, ", ".join(gpu.apis) or "none")
    for key, rt in supervisor.services.items():
        supervisor.set_gpu_missing(key, protection.gpu_api_missing(rt.svc.gpu.apis_any, gpu.apis))
    return gpu


def memory_budget_gb(config: GuardConfig) -> float:
    """Memory for fleet work (--memory-budget-gb; default: a fraction of the total)."""
    if config.budget_gb is not None:
        return config.budget_gb
    return round(memory.total_bytes() / 2**30 * DEFAULT_BUDGET_FRACTION, 2)


def gpu_budget_gb(reader: gpumem.Reader) -> float | None:
    """GPU memory for fleet work: the GPUs' total as NVML reads it (None: not accounted, with
    the reason logged)."""
    read = reader.read()
    if read.total_bytes is None:
        log.info("%s: GPU memory is not accounted in admission", read.error)
        return None
    log.info("GPU memory: %s", ", ".join(f"GPU {g['index']} {g['name']}: "
                                         f"{g['total_bytes'] / 2**30:.1f} GB" for g in read.gpus))
    return round(read.total_bytes / 2**30, 2)


def restore_rules(guard: Guard, state_dir: Path,
                  protect: Callable[[list[Action]], None]) -> None:
    """The host rules an operator set before a restart (hostrules.py), set on ``guard``
    again, each one's actions applied (``protect``) before the next is set."""
    kept, problem = hostrules.read(state_dir)
    if problem is not None:
        log.warning("%s", problem)
    for rule in hostrules.rules_to_apply(kept):
        log.info("host rule %s kept from before the restart", rule)
        protect(guard.set_rule(rule))


def apply(actions: list[Action], admission: Admission, queue: JobQueue,
          supervisor: Supervisor) -> None:
    """Apply what host protection reports, in its order."""
    for a in actions:
        if isinstance(a, Pause):
            admission.paused = a.reason  # nothing is admitted while set
        elif isinstance(a, AllowGpu):
            admission.gpu_allowed = a.allowed
        elif isinstance(a, ReleaseGpuJobs):
            queue.release([r.job_id for r in admission.holding() if r.gpu], a.reason)
        elif isinstance(a, ReleaseJobs):
            queue.release(list(a.job_ids), a.reason)
        elif isinstance(a, Hold):
            supervisor.set_hold(a.key, a.reason)
            if a.release_users and a.reason is not None:
                # Released after the hold: its pools count 0 by now, nothing is readmitted.
                queue.release(queue.users_of(a.key), a.reason)
        elif isinstance(a, HoldRunners):
            queue.runs.hold_runners(a.reason)
        elif isinstance(a, Admit):
            queue.admit()
