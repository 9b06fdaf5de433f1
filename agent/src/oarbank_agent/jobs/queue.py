"""The node's jobs from submit to their runs: records, the queue, admission, service users.

- ``submit``: the placement check (``placement.check``), the record written ``queued``
  before anyone hears of it, enqueued, then ``admit``.
- ``admit``: admission's FIFO decides (``admission.py``); each admitted job goes
  ``queued -> admitted`` and gets its run (``run.py``); the services' user counts follow;
  a job still waiting says why (admission's reason, or its service's: ``waiting.py``).
- A run over (``JobRuns``' ``on_over``): its tokens go back, a released job is requeued ahead
  of later ones, admission runs again, the services' users are updated.
- ``recover`` (agent start): an interrupted attempt whose runner finished is collected
  (``recovery.collect_interrupted``: its outcome recorded, not run again); every unfinished
  record of the state dir is requeued (``recover``), and attempt numbers on the channel
  continue after the highest recorded (removed records' included: ``JobStore.wire_floor``).
- ``prune``: final jobs older than ``--keep-jobs-s`` are removed, record and workdirs
  (``jobs.expired`` decides), so a busy node's state dir and memory stay bounded.

Nothing is admitted once the agent is stopping (``stopping``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from oarbank_agent import recovery
from oarbank_agent.jobs import machine as jobs
from oarbank_agent.jobs import placement, runnerhealth, waiting
from oarbank_agent.jobs.run import JobRuns, move
from oarbank_agent.modules import compat
from oarbank_agent.operate import control

if TYPE_CHECKING:
    from oarbank_agent.broker.handover import Broker
    from oarbank_agent.jobs.admission import Admission
    from oarbank_agent.jobs.store import JobRecord, JobStore
    from oarbank_agent.modules.loaded import ModuleCtx, NodeInfo
    from oarbank_agent.platform.api import Group
    from oarbank_agent.procs import ProcessRegistry
    from oarbank_agent.services.supervisor import Supervisor
    from oarbank_sdk import manifest as mf

__all__ = ["JobQueue"]

log = logging.getLogger("oarbank_agent")


class JobQueue:
    def __init__(self, *, store: JobStore, supervisor: Supervisor, admission: Admission,
                 broker: Broker, registry: ProcessRegistry, node: NodeInfo,
                 modules: dict[str, ModuleCtx], stopping: asyncio.Event,
                 charge_released: bool = False, release_grace_s: float = 10.0) -> None:
        self.store = store
        self.supervisor = supervisor
        self.admission = admission
        self.broker = broker
        self.modules = modules  # the agent's loaded modules (the same dict)
        self._stopping = stopping
        self.jobs: dict[str, JobRecord] = {}
        # Modules being removed, or removed (module remove) -> why their jobs that are not
        # running fail: such a job is never admitted again (moduleremove.py).
        self.closed: dict[str, str] = {}
        # module id -> its runner's last `doctor --json` (the agent's check_runners)
        self.runner_health: dict[str, runnerhealth.RunnerHealth] = {}
        self.runs = JobRuns(store=store, supervisor=supervisor, broker=broker,
                            registry=registry, node=node, stopping=stopping,
                            service_keys=placement.service_keys, on_over=self._run_over,
                            charge_released=charge_released, release_grace_s=release_grace_s)
        self.runs.closed = self.closed
        # Called after each admission pass, before the waiting jobs' reasons are written
        # (demand eviction: protection/evictor.py).
        self.after_admit: list[Callable[[], None]] = []

    # --- in --------------------------------------------------------------------------------

    def recover(self) -> None:
        """Agent start: the state dir's records; the unfinished ones are queued again."""
        records = self.store.load_all()
        # Attempt numbers on the channel continue after an earlier agent's, so a number in
        # status (and in a service's log) names one attempt of this state dir only.
        used = [n for rec in records for n in _wire_numbers(rec)] + [self.store.wire_floor()]
        if max(used) > 0:
            self.broker.continue_wire_attempts_after(max(used))
        for rec in records:
            self.jobs[rec.job_id] = rec
            if rec.state in jobs.TERMINAL:
                continue
            if rec.module in self.closed:  # its module was removed before this restart
                move(rec, jobs.Event.RECOVER)
                self.runs.fail(rec, self.closed[rec.module])
                continue
            ctx = self.modules.get(rec.module)
            if ctx is None or ctx.manifest.stage(rec.stage) is None:
                log.warning("job %s: module %s / stage %s is not loaded; left queued",
                            rec.job_id, rec.module, rec.stage)
                continue
            stage = ctx.manifest.stage(rec.stage)
            assert stage is not None
            seen = recovery.collect_interrupted(rec, self.store.job_dir(rec.job_id),
                                                compat.max_inline_kb(ctx.manifest),
                                                stage.max_attempts)
            if seen is not None and seen.collect:
                log.warning("job %s: its runner finished before the agent stopped (%s): "
                            "outcome %s collected, not run again", rec.job_id, seen.why,
                            seen.state)
                if rec.state in jobs.TERMINAL:
                    self.store.save(rec)
                    continue
            # queued|admitted|running (previous agent) -> queued; an interrupted attempt is
            # not charged
            elif recovery.uncharge_interrupted(rec):
                log.warning("job %s: its attempt was interrupted by the agent stopping "
                            "(%s); requeued without charge", rec.job_id,
                            seen.why if seen is not None else "no outcome")
            move(rec, jobs.Event.RECOVER)
            self.store.save(rec)
            self._enqueue(rec, ctx)

    def submit(self, ctx: ModuleCtx, st: mf.Stage, payload: dict[str, Any],
               portal: dict[str, Any] | None = None) -> JobRecord:
        """A new job of ``ctx``'s stage ``st`` (``portal``: the grant it came from, fleet
        dispatch). Raises ``control.ControlError`` for a job that can never run here (nothing
        is queued then)."""
        placement.check(ctx, st, self.supervisor, self.admission.budget_gb)
        refused = runnerhealth.refusal(ctx.id, self.runner_health.get(ctx.id))
        if refused is not None:
            raise control.ControlError("runner_undetected", refused)
        # (new) -> queued: on disk before anyone hears of it
        rec = self.store.create(ctx.id, st.name, payload, portal)
        self.jobs[rec.job_id] = rec
        self._enqueue(rec, ctx)
        self.admit()
        return rec

    def _enqueue(self, rec: JobRecord, ctx: ModuleCtx, *, front: bool = False) -> None:
        req = placement.request_for(rec, ctx, self.supervisor)
        if ctx.manifest.runner is not None:  # not admitted while its runner is unhealthy
            req = dataclasses.replace(req, needs=(*req.needs, runnerhealth.pool_key(ctx.id)))
        self.admission.enqueue(req, front=front)

    # --- admission -------------------------------------------------------------------------

    def admit(self) -> None:
        if self._stopping.is_set():
            return
        # Reserving services charge the budget while they run or have users.
        self.admission.service_charges = placement.service_charges(self.supervisor)
        self.admission.service_gpu_charges = placement.service_gpu_charges(self.supervisor)
        for req in self.admission.admit():
            rec = self.jobs[req.job_id]
            # queued -> admitted (tokens taken)
            move(rec, jobs.Event.ADMIT)
            if (rec.reason or "").startswith(waiting.WAITING):
                rec.reason = None  # no longer waiting for its service
            # Not saved here: a restart reads `admitted` as it reads `queued` (both requeued,
            # nothing charged), so the write would tell a crash nothing. The record is next
            # written as `running` (or final), with what changed here.
            self.runs.start(rec, self.modules[rec.module])
        self._update_users()
        for cb in self.after_admit:
            cb()
        for job_id in self.admission.waiting():
            why = self.admission.why_waiting(job_id)
            if why is not None:
                self.jobs[job_id].reason = why  # readable in status; saved with the next change
            else:
                self._note_service_wait(self.jobs[job_id])

    def _note_service_wait(self, rec: JobRecord) -> None:
        """A queued job whose pools count 0 because of its service says so (saved)."""
        ctx = self.modules.get(rec.module)
        stage = ctx.manifest.stage(rec.stage) if ctx else None
        if ctx is None or stage is None:
            return
        health = self.runner_health.get(ctx.id)
        why = ((runnerhealth.wait_reason(ctx.id, health) if health is not None else None)
               or waiting.service_wait_reason(self.supervisor, ctx, stage))
        if why is None and not (rec.reason or "").startswith(waiting.WAITING):
            return
        if why != rec.reason:
            rec.reason = why
            self.store.save(rec)

    def _update_users(self) -> None:
        for key, users in placement.users(self.supervisor, self.admission).items():
            self.supervisor.set_users(key, users)

    def _run_over(self, rec: JobRecord, requeued: bool) -> None:
        """A job's run is over (finished, released or stopped): its tokens go back."""
        self.admission.release(rec.job_id)
        if requeued and rec.module in self.closed:
            self.runs.fail(rec, self.closed[rec.module])  # queued -> failed: module removed
        elif requeued:
            self._enqueue(rec, self.modules[rec.module], front=True)
        if not self._stopping.is_set():
            self.admit()
        self._update_users()

    def cancel(self, job_id: str, reason: str) -> bool:
        """A portal job the node must stop (fleet dispatch): its run ended, or, waiting, it is
        taken out of the queue; either way ``cancelled``, final. False when already final."""
        rec = self.jobs.get(job_id)
        if rec is None or rec.state in jobs.TERMINAL:
            return False
        if self.runs.cancel(job_id, reason):
            return True  # the run ends it (cancelled) and gives its tokens back
        self.admission.cancel(job_id)
        self.admission.release(job_id)  # (an admitted record whose run has not begun)
        # queued|admitted -> cancelled (never ran here)
        self.runs.cancel_unrun(rec, reason)
        self._update_users()
        return True

    def fail_unrun(self, module_id: str) -> list[str]:
        """Fail every unfinished job of a closed module that has no run in progress
        (queued -> failed, with ``closed``'s reason); returns their ids."""
        failed = []
        for rec in list(self.jobs.values()):
            if (rec.module == module_id and rec.state not in jobs.TERMINAL
                    and rec.job_id not in self.runs.tasks):
                self.admission.cancel(rec.job_id)
                if rec.state != jobs.State.QUEUED.value:  # (an admitted record, no run)
                    move(rec, jobs.Event.RECOVER)
                self.runs.fail(rec, self.closed[module_id])
                failed.append(rec.job_id)
        return failed

    def prune(self, now: float, keep_s: float) -> list[str]:
        """Remove the final jobs that finished more than ``keep_s`` ago (now: unix seconds)."""
        gone = jobs.expired(((r.job_id, r.state, r.finished_at) for r in self.jobs.values()),
                            now, keep_s)
        if not gone:
            return []
        self.store.keep_wire_floor(max(n for j in gone for n in (0, *_wire_numbers(
            self.jobs[j]))))
        for job_id in gone:
            # succeeded|failed -> (removed): kept --keep-jobs-s, nobody can wait on it now
            self.store.remove(job_id)
            del self.jobs[job_id]
        log.info("removed %d final job record(s) older than %gs (--keep-jobs-s)",
                 len(gone), keep_s)
        return gone

    async def prune_every(self, keep_s: float) -> None:
        """``prune`` at start, then every half of ``keep_s`` (at least every 10 minutes, at
        most every second), until cancelled."""
        while True:
            try:
                self.prune(time.time(), keep_s)
            except OSError as exc:  # a folder we cannot remove: said, tried again later
                log.warning("removing old job records failed: %s", exc)
            await asyncio.sleep(min(600.0, max(1.0, keep_s / 2)))

    # --- host protection's view ------------------------------------------------------------

    def users_of(self, key: str) -> list[str]:
        """Admitted jobs holding a pool of service ``key``."""
        return placement.users_of(self.supervisor, self.admission, key)

    def running_job_groups(self) -> dict[str, Group]:
        """Running job id -> its runner's group."""
        return self.runs.running_groups(self.jobs)

    def release(self, job_ids: list[str], reason: str) -> None:
        """End these jobs' attempts and requeue them, charging no attempt (host protection)."""
        self.runs.release(job_ids, reason)


def _wire_numbers(rec: JobRecord) -> list[int]:
    """The attempt numbers on the channel a record used."""
    return [n for n in (rec.wire_attempt, *(h.get("wire_attempt") for h in rec.history))
            if isinstance(n, int)]
