"""Demand eviction, performed: after each admission pass, make room for the first job that
memory holds back (``Admission.memory_blocked``) by stopping the idle services
``eviction.choose`` picks; the job is admitted once they are down.

Event-driven: it runs after an admission pass, and asks for the next pass when a service it
stopped is down (``on_service_changed``, the supervisor's change listener) or, when only
services younger than their load time would do, once the youngest needed is old enough (a
loop timer). What is already stopping counts as freed, so a pass meanwhile stops nothing
more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from oarbank_agent.protection import eviction
from oarbank_agent.services import lifecycle as lc

if TYPE_CHECKING:
    from oarbank_agent.jobs.admission import Admission
    from oarbank_agent.services.runtime import ServiceRuntime
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["Evictor"]

log = logging.getLogger("oarbank_agent")

_DONE = (lc.State.STOPPED, lc.State.BACKOFF, lc.State.WITHDRAWN)


class Evictor:
    def __init__(self, supervisor: Supervisor, admission: Admission,
                 admit: Callable[[], None], module_of: Callable[[str], str]) -> None:
        self.supervisor = supervisor
        self.admission = admission
        self._admit = admit  # an admission pass (JobQueue.admit)
        self._module_of = module_of  # job id -> its module id
        self.pending: set[str] = set()  # services stopping for a job
        self._timer: asyncio.TimerHandle | None = None
        supervisor.on_change.append(self.on_service_changed)

    def charges(self, rt: ServiceRuntime) -> dict[str, float]:
        """What stopping ``rt`` gives back, per resource admission accounts."""
        out = {"mem_gb": self.admission.service_charges.get(rt.key, 0.0),
               "gpu_mem_gb": self.admission.service_gpu_charges.get(rt.key, 0.0)}
        return {r: v for r, v in out.items() if v > 0}

    def after_pass(self) -> None:
        """An admission pass is over: make room for the job memory holds back, if any."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        block = self.admission.memory_blocked
        if block is None or self.supervisor.shutting_down:
            return
        freeing: dict[str, float] = {}
        for rt in self.supervisor.services.values():
            if rt.st.state is lc.State.STOPPING and rt.st.users == 0:
                for r, v in self.charges(rt).items():
                    freeing[r] = freeing.get(r, 0.0) + v
        short = {r: v - freeing.get(r, 0.0) for r, v in block.short.items()}
        if all(v <= 1e-9 for v in short.values()):
            if self.pending:
                self.admission.note(block.job_id, "making room: stopping idle "
                                    + ", ".join(sorted(self.pending)))
            return
        now = time.time()
        plan = eviction.choose(short, [self._idle(rt, now)
                                       for rt in self.supervisor.services.values()],
                               protect=block.reserves)
        for_what = f"job {block.job_id} of module {self._module_of(block.job_id)}"
        for key in plan.victims:
            rt = self.supervisor.services[key]
            log.info("%s: evicting it (idle %.1fs, loads in %.2fs, reload cost %.2fs) to make "
                     "room for %s: %s", key, now - (rt.st.idle_since or now),
                     self._load_s(rt), plan.costs.get(key, 0.0), for_what,
                     self.admission.why_waiting(block.job_id) or "waiting for memory")
            self.pending.add(key)
            self.supervisor.evict(key, for_what)
        if plan.victims:
            self.admission.note(block.job_id, "making room: stopping idle "
                                + ", ".join(plan.victims))
        elif plan.wake_in_s is not None:
            self.admission.note(block.job_id, f"{plan.why_not}: evicting in "
                                f"{plan.wake_in_s:g}s")
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(plan.wake_in_s, self._admit)

    def evictable(self) -> dict[str, float]:
        """What stopping every service demand eviction may stop would give back, per resource
        (a fleet claim's ``evictable_mem_gb``, contract 10.4)."""
        now, out = time.time(), dict[str, float]()
        for rt in self.supervisor.services.values():
            idle = self._idle(rt, now)
            if eviction.not_evictable(idle, idle.frees, frozenset()) is None:
                for r, v in idle.frees.items():
                    out[r] = out.get(r, 0.0) + v
        return out

    def on_service_changed(self, key: str) -> None:
        """A service changed: one stopped for a job is down (or kept: a user came first),
        so admission looks again, in the next loop turn."""
        if key not in self.pending:
            return
        rt = self.supervisor.services.get(key)
        if rt is None or rt.st.state in _DONE or (
                rt.st.state is lc.State.READY and rt.st.evict_for is None):
            self.pending.discard(key)
            asyncio.get_running_loop().call_soon(self._admit)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _load_s(self, rt: ServiceRuntime) -> float:
        """Its measured load time; never measured (adopted at a restart): its start timeout,
        the most a load may take."""
        measured = self.supervisor.stats.load_s(rt.key)
        return measured if measured is not None else rt.svc.start_timeout_s

    def _idle(self, rt: ServiceRuntime, now: float) -> eviction.Idle:
        return eviction.Idle(
            key=rt.key, frees=self.charges(rt), load_s=self._load_s(rt),
            ready_for_s=now - rt.ready_at if rt.ready_at is not None else 0.0,
            uses=self.supervisor.stats.uses(rt.key, now), users=rt.st.users,
            yieldable=rt.svc.yieldable, lifecycle=rt.svc.lifecycle,
            held=rt.st.held is not None,
            ready=rt.st.state is lc.State.READY and not rt.busy() and rt.st.evict_for is None)
