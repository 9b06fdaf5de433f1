"""Host protection, the sampling half (contract section 5): samples the OS, reports actions.

The decisions are pure (``protection``: pressure with hysteresis, soft stops, the hard
victim; ``lifecycle``: what a hold does to a service; ``admission``: memory budget and GPU
rules); this module reads the host's available memory every ``sample_s`` seconds (2 s by
default, ``host.memory``) and the resident memory of each group (``Groups.resident``), keeps
the protection state (pressure, memory holds, host rules), and *reports* what should happen
as a list of actions (``Pause``, ``AllowGpu``, ``Hold``, ``ReleaseJobs``, ``ReleaseGpuJobs``,
``HoldRunners``, ``Admit``), in the order they must be applied. The agent applies them (``Agent._protect``):
the guard reads the supervisor's services but changes nothing outside itself.

Holds (a service's ``held`` in the report), first that applies:

- ``preempt_protection``: a host rule. While GPU work is forbidden every yieldable GPU service
  (``gpu.use`` other than ``none``) is held, and GPU jobs are not admitted (``admission``).
  While an eviction is in force every yieldable service is held. An eviction is a rule like
  the GPU one, not a one-shot: it lasts until ``protect --end-evict`` (so a queued job cannot
  bring the evicted services straight back); the agent keeps the rules across restarts
  (``hostrules.py``).
- ``preempt_memory``: memory pressure. Under the soft floor every idle, running, yieldable
  service is stopped and held; under the hard floor one victim per sample (largest resident
  footprint of its process group, among running jobs and running yieldable services). The
  held set is kept until pressure ends (available back above soft + recover margin); then
  every memory hold lifts at once and waiting jobs bring the services back. While there is any
  pressure nothing new is admitted (``admission.paused``), and every running job whose runner
  accepts a pause (``cooperative_pause``) is paused, first, before anything else is acted on;
  it is resumed when the pressure ends.

A service that becomes held has its users **released**: each job holding one of its pools
has its attempt ended and goes back to the queue without being charged an attempt
(``JobQueue.release``, applied by the agent). A job chosen as the hard victim is released the
same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oarbank_agent import platform
from oarbank_agent.host import memory
from oarbank_agent.protection.decisions import (
    HELD_MEMORY,
    HELD_PROTECTION,
    Candidate,
    Floors,
    Pressure,
    classify,
    hard_victim,
    soft_stops,
)
from oarbank_agent.services import lifecycle as lc

if TYPE_CHECKING:
    from oarbank_agent.platform.api import Group
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["Guard", "GuardConfig", "DEFAULT_BUDGET_FRACTION", "DEFAULT_SAMPLE_S",
           "Action", "Pause", "AllowGpu", "Hold", "ReleaseJobs", "ReleaseGpuJobs", "HoldRunners",
           "Admit"]

log = logging.getLogger("oarbank_agent.protection.guard")

DEFAULT_SAMPLE_S = 2.0
DEFAULT_BUDGET_FRACTION = 0.5  # of total memory: a person's computer keeps the other half
_UP = (lc.State.STARTING, lc.State.READY)


@dataclass
class GuardConfig:
    floors: Floors
    sample_s: float = DEFAULT_SAMPLE_S
    budget_gb: float | None = None  # None: DEFAULT_BUDGET_FRACTION of total memory


# --- what the guard reports (applied by the agent, in order) --------------------------------

@dataclass(frozen=True)
class Pause:
    """Admission's pause: nothing is admitted while ``reason`` is set (None: admit again)."""

    reason: str | None


@dataclass(frozen=True)
class AllowGpu:
    """Whether GPU jobs may be admitted (the forbid-gpu host rule)."""

    allowed: bool


@dataclass(frozen=True)
class Hold:
    """Hold service ``key`` down (``reason``) or lift its hold (None); ``release_users``: a
    newly held service's users are released right after (their attempts ended, requeued)."""

    key: str
    reason: str | None
    release_users: bool = False


@dataclass(frozen=True)
class ReleaseJobs:
    """End these jobs' attempts and requeue them, not charged."""

    job_ids: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class ReleaseGpuJobs:
    """Release every admitted GPU job (the forbid-gpu rule: also those on a service that does
    not yield)."""

    reason: str


@dataclass(frozen=True)
class HoldRunners:
    """Hold (``reason``) or resume (None) the running jobs whose runners accept a pause
    (runner protocol, Control): under any pressure they are paused before anything is
    stopped, resumed when it ends (``JobRuns.hold_runners``)."""

    reason: str | None


@dataclass(frozen=True)
class Admit:
    """Try admission again (pressure ended)."""


Action = Pause | AllowGpu | Hold | ReleaseJobs | ReleaseGpuJobs | HoldRunners | Admit


class Guard:
    """``supervisor``: read for the services' states; ``running_jobs``: running job id -> its
    runner's process group (hard-floor candidates); ``report``: where the actions of each
    periodic sample go (the agent applies them)."""

    def __init__(self, config: GuardConfig, supervisor: Supervisor, *,
                 running_jobs: Callable[[], dict[str, Group]],
                 report: Callable[[list[Action]], None]) -> None:
        self.supervisor = supervisor
        self._running_jobs = running_jobs
        self._report = report
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
                self._report(self.sample())
            except Exception:  # a bug here must not end protection for good
                log.exception("memory guard sample failed")
            await asyncio.sleep(self.config.sample_s)

    # --- host rules (control socket: op "protect") ----------------------------------------

    def set_rule(self, rule: str) -> list[Action]:
        """``forbid-gpu`` | ``allow-gpu`` | ``evict`` | ``end-evict``: the actions it takes.
        Raises ValueError for another rule."""
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
        out: list[Action] = [AllowGpu(not self.gpu_forbidden)]
        if self.gpu_forbidden:
            # GPU jobs are held too, also those on a service that does not yield.
            out.append(ReleaseGpuJobs(HELD_PROTECTION))
        return out + self.refresh()

    def rules(self) -> dict[str, Any]:
        return {"gpu_forbidden": self.gpu_forbidden, "evicted": self.evicted}

    # --- memory ---------------------------------------------------------------------------

    def sample(self) -> list[Action]:
        """Sample memory now: the actions the pressure asks for."""
        frac = memory.available_fraction()
        self.available_fraction = frac
        before = self.pressure
        self.pressure = classify(frac, self.config.floors, before)
        if self.pressure is not before:
            log.warning("memory pressure %s -> %s (%.1f%% available; floors soft %.1f%% "
                        "hard %.1f%%)", before.value, self.pressure.value, frac * 100,
                        self.config.floors.soft * 100, self.config.floors.hard * 100)
        sup = self.supervisor
        if self.pressure is Pressure.NONE:
            out: list[Action] = [Pause(None), HoldRunners(None)]
            if self.mem_held:
                self.mem_held.clear()
                out += self.refresh()
                out.append(Admit())
            elif before is not Pressure.NONE:
                out.append(Admit())
            return out
        why = (f"memory pressure: {frac * 100:.1f}% of memory available "
               f"(soft floor {self.config.floors.soft * 100:g}%)")
        out = [Pause(why), HoldRunners(why)]
        running = [rt for rt in sup.services.values()
                   if rt.st.state in _UP and rt.held is None and rt.svc.lifecycle != "manual"]
        services = [Candidate(rt.key, "service", 0, rt.svc.yieldable, rt.st.users)
                    for rt in running]
        self.mem_held.update(soft_stops(services))
        if self.pressure is Pressure.HARD:
            out += self._hard(running)
        return out + self.refresh()

    def _hard(self, running: list[Any]) -> list[Action]:
        jobs = self._running_jobs()  # job id -> runner's group
        svc_groups = {rt.key: rt.group for rt in running
                      if rt.group is not None and rt.key not in self.mem_held}
        rss = platform.current().groups.resident(
            list(dict.fromkeys([*jobs.values(), *svc_groups.values()])))
        cands = [Candidate(job_id, "job", rss.get(pg, 0)) for job_id, pg in jobs.items()]
        by_key = {rt.key: rt for rt in running}
        cands += [Candidate(key, "service", rss.get(pg, 0), by_key[key].svc.yieldable,
                            by_key[key].st.users) for key, pg in svc_groups.items()]
        victim = hard_victim(cands)
        if victim is None:
            log.warning("under the hard memory floor with nothing that may be stopped")
            return []
        self.last_victim = {"key": victim.key, "kind": victim.kind,
                            "footprint_bytes": victim.footprint_bytes, "time": time.time()}
        log.warning("hard memory floor: stopping %s %s (%d MiB resident)", victim.kind,
                    victim.key, victim.footprint_bytes >> 20)
        if victim.kind == "service":
            self.mem_held.add(victim.key)  # held (and its users released) by the refresh
            return []
        return [ReleaseJobs((victim.key,), HELD_MEMORY)]

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

    def refresh(self) -> list[Action]:
        """The wanted hold of every service whose hold differs; a newly held one has its users
        released (after the hold: its pools count 0 from then on, so nothing is readmitted
        meanwhile)."""
        out: list[Action] = []
        for key, rt in self.supervisor.services.items():
            want = self.wanted_hold(rt)
            was = rt.held
            if want == was:
                continue
            out.append(Hold(key, want, release_users=want is not None and was is None))
        return out

    def report(self, budget_gb: float | None, charged_gb: float) -> dict[str, Any]:
        """For status: the protection state, with admission's budget and what is charged."""
        vm_frac = self.available_fraction
        return {
            "pressure": self.pressure.value,
            "available_fraction": None if vm_frac is None else round(vm_frac, 4),
            "floors": {"soft": self.config.floors.soft, "hard": self.config.floors.hard,
                       "recover_margin": self.config.floors.recover_margin},
            "sample_s": self.config.sample_s,
            "budget_gb": budget_gb,
            "charged_gb": round(charged_gb, 3),
            "held_for_memory": sorted(self.mem_held),
            "last_victim": self.last_victim,
            "rules": self.rules(),
        }
