"""Host protection, the acting half (contract section 5): samples the OS, applies holds.

The decisions are pure (``protection``: pressure with hysteresis, soft stops, the hard
victim, hold precedence; ``admission``: memory budget and GPU rules); this module reads
``psutil.virtual_memory()`` every ``sample_s`` seconds (2 s by default), the resident memory
of process groups from ``/proc``, and acts through the agent and its supervisor.

Holds (a service's ``held`` in the report), first that applies:

- ``preempt_protection``: a host rule. While GPU work is forbidden every yieldable GPU service
  (``gpu.use`` other than ``none``) is held, and GPU jobs are not admitted (``admission``).
  While an eviction is in force every yieldable service is held. An eviction is a rule like
  the GPU one, not a one-shot: it lasts until ``protect --end-evict`` (so a queued job cannot
  bring the evicted services straight back); host rules are not persisted across agent
  restarts.
- ``preempt_memory``: memory pressure. Under the soft floor every idle, running, yieldable
  service is stopped and held; under the hard floor one victim per sample (largest resident
  footprint of its process group, among running jobs and running yieldable services). The
  held set is kept until pressure ends (available back above soft + recover margin); then
  every memory hold lifts at once and waiting jobs bring the services back. While there is any
  pressure nothing new is admitted (``admission.paused``).

A service that becomes held has its users **released**: each job holding one of its pools
has its attempt ended and goes back to the queue without being charged an attempt
(``Agent.release_jobs``). A job chosen as the hard victim is released the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from . import lifecycle as lc
from . import procs
from .protection import (
    HELD_MEMORY,
    HELD_PROTECTION,
    Candidate,
    Floors,
    Pressure,
    classify,
    hard_victim,
    soft_stops,
)

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["Guard", "GuardConfig", "group_rss", "DEFAULT_BUDGET_FRACTION", "DEFAULT_SAMPLE_S"]

log = logging.getLogger("oarbank_agent.guard")

DEFAULT_SAMPLE_S = 2.0
DEFAULT_BUDGET_FRACTION = 0.5  # of total memory: a person's computer keeps the other half
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_UP = (lc.State.STARTING, lc.State.READY)


@dataclass
class GuardConfig:
    floors: Floors
    sample_s: float = DEFAULT_SAMPLE_S
    budget_gb: float | None = None  # None: DEFAULT_BUDGET_FRACTION of total memory


def group_rss(pgids: set[int]) -> dict[int, int]:
    """Resident bytes of every live member of each process group, summed per group (one
    pass over /proc)."""
    out = dict.fromkeys(pgids, 0)
    for pid, pgid, state, _ticks in procs._proc_table():
        if pgid not in out or state == "Z":
            continue
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                out[pgid] += int(f.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue  # it exited meanwhile
    return out


class Guard:
    def __init__(self, agent: Agent, config: GuardConfig) -> None:
        self.agent = agent
        self.config = config
        self.pressure = Pressure.NONE
        self.available_fraction: float | None = None
        self.mem_held: set[str] = set()  # service keys held for memory until pressure ends
        self.gpu_forbidden = False
        self.evicted = False
        self.last_victim: dict[str, Any] | None = None  # for status: what the hard floor took
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="memory guard")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # a bug here must not end protection for good
                log.exception("memory guard sample failed")
            await asyncio.sleep(self.config.sample_s)

    # --- host rules (control socket: op "protect") ----------------------------------------

    def set_rule(self, rule: str) -> None:
        """``forbid-gpu`` | ``allow-gpu`` | ``evict`` | ``end-evict``."""
        if rule == "forbid-gpu":
            self.gpu_forbidden = True
        elif rule == "allow-gpu":
            self.gpu_forbidden = False
        elif rule == "evict":
            self.evicted = True
        elif rule == "end-evict":
            self.evicted = False
        else:
            raise ValueError(f"unknown host rule {rule!r} "
                             "(known: forbid-gpu, allow-gpu, evict, end-evict)")
        log.info("host rule: %s", rule)
        self.agent.admission.gpu_allowed = not self.gpu_forbidden
        if self.gpu_forbidden:
            # GPU jobs are held too, also those on a service that does not yield.
            self.agent.release_jobs([r.job_id for r in self.agent.admission.holding() if r.gpu],
                                    HELD_PROTECTION)
        self.refresh()

    def rules(self) -> dict[str, Any]:
        return {"gpu_forbidden": self.gpu_forbidden, "evicted": self.evicted}

    # --- memory ---------------------------------------------------------------------------

    def sample(self) -> None:
        vm = psutil.virtual_memory()
        frac = vm.available / vm.total if vm.total else 1.0
        self.available_fraction = frac
        before = self.pressure
        self.pressure = classify(frac, self.config.floors, before)
        if self.pressure is not before:
            log.warning("memory pressure %s -> %s (%.1f%% available; floors soft %.1f%% "
                        "hard %.1f%%)", before.value, self.pressure.value, frac * 100,
                        self.config.floors.soft * 100, self.config.floors.hard * 100)
        sup = self.agent.supervisor
        if self.pressure is Pressure.NONE:
            self.agent.admission.paused = None
            if self.mem_held:
                self.mem_held.clear()
                self.refresh()
                self.agent.admit()
            elif before is not Pressure.NONE:
                self.agent.admit()
            return
        self.agent.admission.paused = (
            f"memory pressure: {frac * 100:.1f}% of memory available "
            f"(soft floor {self.config.floors.soft * 100:g}%)")
        running = [rt for rt in sup.services.values()
                   if rt.st.state in _UP and rt.held is None and rt.svc.lifecycle != "manual"]
        services = [Candidate(rt.key, "service", 0, rt.svc.yieldable, rt.st.users)
                    for rt in running]
        self.mem_held.update(soft_stops(services))
        if self.pressure is Pressure.HARD:
            self._hard(running)
        self.refresh()

    def _hard(self, running: list[Any]) -> None:
        jobs = self.agent.running_job_groups()  # job id -> runner pgid
        svc_groups = {rt.key: rt.pgid for rt in running
                      if rt.pgid is not None and rt.key not in self.mem_held}
        rss = group_rss(set(jobs.values()) | set(svc_groups.values()))
        cands = [Candidate(job_id, "job", rss.get(pg, 0)) for job_id, pg in jobs.items()]
        by_key = {rt.key: rt for rt in running}
        cands += [Candidate(key, "service", rss.get(pg, 0), by_key[key].svc.yieldable,
                            by_key[key].st.users) for key, pg in svc_groups.items()]
        victim = hard_victim(cands)
        if victim is None:
            log.warning("under the hard memory floor with nothing that may be stopped")
            return
        self.last_victim = {"key": victim.key, "kind": victim.kind,
                            "footprint_bytes": victim.footprint_bytes, "time": time.time()}
        log.warning("hard memory floor: stopping %s %s (%d MiB resident)", victim.kind,
                    victim.key, victim.footprint_bytes >> 20)
        if victim.kind == "service":
            self.mem_held.add(victim.key)
        else:
            self.agent.release_jobs([victim.key], HELD_MEMORY)

    # --- holds ----------------------------------------------------------------------------

    def wanted_hold(self, rt: Any) -> str | None:
        """The hold a service should have now (pure over the guard's state)."""
        if rt.svc.yieldable and rt.svc.lifecycle != "manual":
            if self.evicted:
                return HELD_PROTECTION
            if self.gpu_forbidden and rt.svc.gpu.use != "none":
                return HELD_PROTECTION
        if rt.key in self.mem_held:
            return HELD_MEMORY
        return None

    def refresh(self) -> None:
        """Apply the wanted hold to every service; a newly held one has its users released."""
        sup = self.agent.supervisor
        for key, rt in sup.services.items():
            want = self.wanted_hold(rt)
            was = rt.held
            if want == was:
                continue
            if want is not None and was is None:
                # Released first (attempt ended, requeued), then the service stops: its pools
                # count 0 from set_hold on, so nothing is readmitted meanwhile.
                sup.set_hold(key, want)
                self.agent.release_jobs(self.agent.users_of(key), want)
            else:
                sup.set_hold(key, want)

    def report(self) -> dict[str, Any]:
        vm_frac = self.available_fraction
        return {
            "pressure": self.pressure.value,
            "available_fraction": None if vm_frac is None else round(vm_frac, 4),
            "floors": {"soft": self.config.floors.soft, "hard": self.config.floors.hard,
                       "recover_margin": self.config.floors.recover_margin},
            "sample_s": self.config.sample_s,
            "budget_gb": self.agent.admission.budget_gb,
            "charged_gb": round(self.agent.admission.charged_gb(), 3),
            "held_for_memory": sorted(self.mem_held),
            "last_victim": self.last_victim,
            "rules": self.rules(),
        }
