"""The run of an admitted job: wait for its services, run attempts, retry, finish or release.

One task per admitted job (``JobRuns.start``). The job's states and their table are in
``machine.py``; every transition here is labelled where it happens and goes through
``jobs.apply``, and the record is saved before the change matters (``store.py``). The
``running`` record is written once the runner is spawned, not before: it is not fsynced (a
crash reads it as ``queued`` either way), so no write waits ahead of the runner's fork.

- Its endpoint services are awaited first (``Supervisor.await_ready``, through starts and
  backoffs). A service that can never become ready fails the job (``service_unavailable``); one
  that is withdrawn or held releases it instead: it waits, readably, for the service to return.
- An attempt is ``runner.run_attempt``. Exit 75 with attempts left retries with the tokens kept;
  anything else finishes the job. An attempt that fails while a service it reserves died under
  it is released instead (``jobs.after_attempt``): not charged, requeued, it waits for the
  restart; its history entry says which service and why. Running attempts are not ended when
  their service dies: a connect made while it restarts waits for it (contract 3.6), so a job
  that rides through the restart keeps its attempt.
- ``release`` (host protection) cancels the task: the attempt is ended, not charged, and the
  job goes back to the queue ahead of later ones. A cancel while the agent stops leaves the job
  ``queued`` on disk for the next agent.
- A runner that accepts the control document (``control.py``; written by ``controlio.py``) is
  asked first: a release asks it to stop at a safe point and cancels the task only past
  ``release_grace_s``; a drain asks the same of every such runner at its start (its grace is
  ``--drain-s``). However such an attempt ends then, bar a success, it is released (an
  acknowledged stop, exit 75 with ``fault`` transient, included: never charged). Host
  protection pauses and resumes such runners (``hold_runners``), their time held counted in
  ``paused_s``. A runner that writes checkpoints resumes from its last on its next attempt
  (``checkpoints.py``).
- ``cancel`` (fleet dispatch: the portal took the job back) cancels the task: the attempt is
  ended and the job is ``cancelled``, final, nothing retried.
- When a run is over (any way), ``on_over(record, requeued)`` gives its tokens back: admission
  is the agent's, not this module's. When a job becomes final, each of ``on_final`` hears it
  (fleet dispatch reports a portal job's result).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from oarbank_agent import platform
from oarbank_agent.jobs import checkpoints, control, runnerevents
from oarbank_agent.jobs import machine as jobs
from oarbank_agent.jobs.controlio import AttemptControl
from oarbank_agent.jobs.runner import run_attempt
from oarbank_agent.jobs.store import JobRecord, JobStore
from oarbank_agent.services import lifecycle as lc

if TYPE_CHECKING:
    from pathlib import Path

    from oarbank_agent.broker.handover import Broker
    from oarbank_agent.modules.loaded import ModuleCtx, NodeInfo
    from oarbank_agent.platform.api import Group
    from oarbank_agent.procs import ProcessRegistry
    from oarbank_agent.services.supervisor import Supervisor
    from oarbank_sdk import manifest as mf

__all__ = ["JobRuns", "move", "SERVICE_DIED"]

# How a release for a dead service starts its reason (history, status): also what counts
# such releases toward their bound (jobs.after_attempt).
SERVICE_DIED = "service died under the attempt:"

log = logging.getLogger("oarbank_agent")


def move(rec: JobRecord, event: jobs.Event) -> None:
    """Apply ``event`` to the record's state (the record keeps the plain string)."""
    rec.state = jobs.apply(rec.state, event).value


class JobRuns:
    """The tasks of the admitted jobs, and the futures waiting for jobs to finish."""

    def __init__(self, *, store: JobStore, supervisor: Supervisor, broker: Broker,
                 registry: ProcessRegistry, node: NodeInfo, stopping: asyncio.Event,
                 service_keys: Callable[[ModuleCtx, mf.Stage], list[str]],
                 on_over: Callable[[JobRecord, bool], None],
                 charge_released: bool = False, release_grace_s: float = 10.0) -> None:
        self.store = store
        self.supervisor = supervisor
        self.broker = broker
        self.registry = registry
        self.node = node
        self._stopping = stopping
        self._service_keys = service_keys
        self._on_over = on_over
        # Test-only fault (faults.CHARGE_RELEASED): a released attempt is charged.
        self._charge_released = charge_released
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._done: dict[str, list[asyncio.Future[None]]] = {}
        self._releasing: dict[str, str] = {}  # job id -> why its task is being cancelled
        self._cancelling: dict[str, str] = {}  # job id -> why it ends cancelled (cancel)
        # Called with each record that became final (succeeded, failed, cancelled).
        self.on_final: list[Callable[[JobRecord], None]] = []
        # Modules being removed -> why (JobQueue.closed): no new attempt of theirs starts.
        self.closed: dict[str, str] = {}
        # Runners that accept the control document: job id -> its running attempt's.
        self.controls: dict[str, AttemptControl] = {}
        self.release_grace_s = release_grace_s  # a release's stop, then the task is cancelled
        self._graces: dict[str, asyncio.TimerHandle] = {}
        self._nudges = platform.current().nudges  # None: no runner control on this backend

    # --- starting, waiting, releasing ------------------------------------------------------

    def start(self, rec: JobRecord, ctx: ModuleCtx) -> None:
        self.tasks[rec.job_id] = asyncio.create_task(self._run(rec, ctx), name=f"job {rec.job_id}")

    def when_final(self, job_id: str) -> asyncio.Future[None]:
        """A future resolved when the job finishes (succeeded or failed)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._done.setdefault(job_id, []).append(fut)
        return fut

    def release(self, job_ids: Iterable[str], reason: str) -> None:
        """End these jobs' attempts and requeue them, charging no attempt (host protection). A
        runner that accepts a stop is asked for one first, and ended past the grace."""
        for job_id in job_ids:
            task = self.tasks.get(job_id)
            if task is None or task.done() or job_id in self._releasing:
                continue
            self._releasing[job_id] = reason
            if self._ask_stop(job_id, reason):
                log.warning("job %s released (%s): asked to stop at a safe point, ended in "
                            "%gs if it has not", job_id, reason, self.release_grace_s)
                self._graces[job_id] = asyncio.get_running_loop().call_later(
                    self.release_grace_s, self._past_grace, job_id)
                continue
            log.warning("job %s released (%s): requeued", job_id, reason)
            task.cancel()

    def cancel(self, job_id: str, reason: str) -> bool:
        """End this job's run: its attempt ended, the job ``cancelled`` (the portal took it
        back). False when it has no run in progress."""
        task = self.tasks.get(job_id)
        if task is None or task.done():
            return False
        self._cancelling[job_id] = reason
        task.cancel()
        return True

    def ask_to_stop(self, job_ids: Iterable[str], reason: str) -> list[str]:
        """The drain: each of these jobs whose runner accepts a stop is asked for one (released
        when it ends); the others are left to finish. Returns the jobs asked."""
        asked = []
        for job_id in job_ids:
            if job_id not in self._releasing and self._ask_stop(job_id, reason):
                self._releasing[job_id] = reason
                asked.append(job_id)
        return asked

    def _ask_stop(self, job_id: str, reason: str) -> bool:
        ctl = self.controls.get(job_id)
        return ctl is not None and ctl.accepts.stop and ctl.ask_stop(reason)

    def _past_grace(self, job_id: str) -> None:
        self._graces.pop(job_id, None)
        task, ctl = self.tasks.get(job_id), self.controls.get(job_id)
        if task is None or task.done():
            return
        log.warning("job %s did not stop within %gs of being asked: ended", job_id,
                    self.release_grace_s)
        if ctl is not None:
            ctl.killed = True
        task.cancel()

    def hold_runners(self, reason: str | None) -> None:
        """Host protection wants runners held (``reason``) or not (None): pause or resume the
        running jobs that accept it (``control.plan_pauses``)."""
        plan = control.plan_pauses(reason is not None, [
            control.PauseView(job_id, ctl.accepts.pause and ctl.running and not ctl.doc.stop,
                              ctl.paused_for())
            for job_id, ctl in self.controls.items()])
        for job_id in plan.pause:
            if self.controls[job_id].pause(reason or ""):
                log.warning("job %s paused (%s)", job_id, reason)
        for job_id in plan.resume:
            ctl = self.controls[job_id]
            if ctl.resume():
                log.warning("job %s resumed (held %.2fs this attempt)", job_id, ctl.paused_s)
        if plan.release:
            self.release(plan.release, f"paused longer than {control.PAUSE_MAX_S:g}s "
                         f"({reason})")

    def running_groups(self, records: dict[str, JobRecord]) -> dict[str, Group]:
        """Running job id -> its runner's group."""
        out = {}
        for g in self.registry.records():
            job_id = g.label.rsplit(".", 1)[0]
            if g.kind == "runner" and job_id in records and records[job_id].state == "running":
                out[job_id] = g.group
        return out

    async def cancel_all(self) -> None:
        """The agent is stopping: every run ends, its job stays queued on disk."""
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- one job ---------------------------------------------------------------------------

    async def _run(self, rec: JobRecord, ctx: ModuleCtx) -> None:
        stage = ctx.manifest.stage(rec.stage)
        assert stage is not None
        requeue = False
        attempt_id: str | None = None
        started = 0.0
        accepts = (control.accepts(ctx.manifest.raw) if self._nudges is not None
                   else control.Accepts())
        ctl: AttemptControl | None = None
        extra: dict[str, Any] = {}  # the attempt's history entry's control fields
        ended_on_stop = False  # it ended by itself after the agent asked it to stop
        try:
            while True:
                for key in self._service_keys(ctx, stage):
                    if not await self.supervisor.await_ready(key):
                        if self._stopping.is_set():
                            raise asyncio.CancelledError
                        rt = self.supervisor.services[key]
                        why = rt.st.error or rt.st.state.value
                        if (rt.st.state is lc.State.WITHDRAWN or rt.held is not None
                                or rt.st.disabled):
                            # admitted -> queued (release, below): it waits (readably) for the
                            # service to return (or its module to be enabled)
                            down = rt.held or ("disabled" if rt.st.disabled else "withdrawn")
                            self._releasing[rec.job_id] = f"service {key} is {down} ({why})"
                            raise asyncio.CancelledError
                        # admitted -> failed (its service can never become ready)
                        self._finish(rec, jobs.Event.FAIL, None,
                                     f"service_unavailable: {key} is {rt.st.state.value} ({why})")
                        return
                # admitted -> running
                rec.attempts += 1
                move(rec, jobs.Event.RUN)
                # Released attempts keep their numbers: ids and workdirs are never reused.
                number = rec.attempts + rec.released
                attempt_id = f"{rec.job_id}.{number}"
                # The number services see for this attempt (run_attempt ends it in the broker).
                rec.wire_attempt = self.broker.wire_attempt(attempt_id)
                workdir = self.store.job_dir(rec.job_id) / f"a{number}"
                started = time.time()
                rec.started_at = rec.started_at or started
                # Each reserved service's incarnation: did it die under this attempt?
                marks = {k: (self.supervisor.services[k].deaths,
                             self.supervisor.services[k].channel)
                         for k in self._service_keys(ctx, stage)}
                resume, extra = (self._resume(rec, ctx, stage, workdir)
                                 if accepts.checkpoint else (None, {}))
                if accepts.any:
                    assert self._nudges is not None
                    ctl = self.controls[rec.job_id] = AttemptControl(workdir, accepts,
                                                                     self._nudges)
                outcome = await run_attempt(ctx, self.node, stage, job_id=rec.job_id,
                                            payload=rec.payload, attempt_id=attempt_id,
                                            workdir=workdir, broker=self.broker,
                                            registry=self.registry,
                                            # `running` on disk, right after the fork (in
                                            # the task step the factory's answer wakes, so
                                            # before any connect of the runner is read)
                                            on_spawned=lambda: self.store.save(rec),
                                            control=ctl, resume=resume)
                if ctl is not None:
                    self._control_over(rec, ctl, extra)
                    ending = (control.stop_ending(outcome.state, outcome.exit_code,
                                                  outcome.fault, ctl.killed)
                              if ctl.stop_asked_at is not None else None)
                    ctl = None
                    if ending is not None:
                        # raised into the release branch below: running -> queued, not
                        # charged (an acknowledged stop is the agent's doing, not a failure)
                        extra["stop"] = ending
                        self._releasing[rec.job_id] = (
                            f"{self._releasing.get(rec.job_id, 'stopped')}; asked to stop at a "
                            f"safe point: {ending} ({outcome.reason})")
                        ended_on_stop = True
                        raise asyncio.CancelledError
                died = await self._died_under(marks, outcome.state != "succeeded"
                                              and outcome.fault != "job")
                event = jobs.after_attempt(
                    outcome.state, outcome.fault, rec.attempts, stage.max_attempts,
                    list(died),
                    sum(1 for h in rec.history if h.get("outcome") == "released"
                        and str(h.get("reason", "")).startswith(SERVICE_DIED)))
                if event is jobs.Event.RELEASE:
                    # raised into the release branch below: running -> queued, not charged
                    self._releasing[rec.job_id] = "; ".join(
                        f"{SERVICE_DIED} {k} ({why}); the runner then said: "
                        f"{outcome.reason}" for k, why in died.items())
                    raise asyncio.CancelledError
                rec.history.append({"attempt": rec.attempts, "attempt_id": attempt_id,
                                    "wire_attempt": rec.wire_attempt, "started_at": started,
                                    "finished_at": time.time(),
                                    "outcome": outcome.state, "exit_code": outcome.exit_code,
                                    "reason": outcome.reason, "fault": outcome.fault, **extra,
                                    # what the runner emitted (--events), bounded
                                    **(runnerevents.collect(workdir)
                                       if runnerevents.declared(ctx.manifest) else {})})
                if event is jobs.Event.RETRY:
                    # running -> admitted (transient failure, attempts left; tokens kept)
                    move(rec, jobs.Event.RETRY)
                    rec.exit_code, rec.reason = outcome.exit_code, outcome.reason
                    self.store.save(rec)
                    if self._stopping.is_set() or rec.module in self.closed:
                        # The agent drains (or the module is being removed): no new attempt
                        # now; admitted -> queued below, the next agent on this state dir runs
                        # it (a removed module's job fails: JobQueue.fail_unrun).
                        raise asyncio.CancelledError
                    continue
                reason = outcome.reason
                if outcome.state == "retry":
                    reason = f"{reason} (gave up after {rec.attempts} attempts)"
                # running -> succeeded | failed
                self._finish(rec, event, outcome.exit_code, reason, outcome.result)
                return
        except asyncio.CancelledError:
            cancelled_for = self._cancelling.pop(rec.job_id, None)
            if cancelled_for is not None:
                if ctl is not None:
                    self._control_over(rec, ctl, extra)
                if rec.state == "running":
                    rec.history.append({"attempt": rec.attempts, "attempt_id": attempt_id,
                                        "wire_attempt": rec.wire_attempt,
                                        "started_at": started, "finished_at": time.time(),
                                        "outcome": "cancelled", "exit_code": None,
                                        "reason": cancelled_for, "fault": None, **extra})
                # queued|admitted|running -> cancelled: the portal took the job back
                self._finish(rec, jobs.Event.CANCEL, None, cancelled_for)
                return
            released_for = self._releasing.pop(rec.job_id, "")
            if ctl is not None:  # cancelled mid-attempt
                self._control_over(rec, ctl, extra)
                if ctl.killed:
                    extra["stop"] = control.KILLED
                    released_for += (f"; asked to stop at a safe point, it had not within "
                                     f"{self.release_grace_s:g}s: ended")
            if not released_for or (self._stopping.is_set() and not ended_on_stop):
                # admitted|running -> queued: the agent is stopping; the job is resumed later.
                move(rec, jobs.Event.REQUEUE)
                self.store.save(rec)
                raise
            # admitted|running -> queued (released by host protection, or its service died
            # under the attempt): the attempt is over, it is not charged and not a failure;
            # the job goes back ahead of later ones.
            if rec.state == "running":
                if not self._charge_released:  # (the fault: test only)
                    rec.attempts -= 1
                rec.released += 1
                rec.history.append({"attempt": None, "attempt_id": attempt_id,
                                    "wire_attempt": rec.wire_attempt, "started_at": started,
                                    "finished_at": time.time(),
                                    "outcome": "released", "exit_code": None,
                                    "reason": released_for, "fault": None, **extra})
            move(rec, jobs.Event.RELEASE)
            rec.reason = f"released: {released_for}"
            self.store.save(rec)
            requeue = True
        finally:
            self.tasks.pop(rec.job_id, None)
            self._releasing.pop(rec.job_id, None)  # (a stop asked of a run that succeeded)
            self._cancelling.pop(rec.job_id, None)  # (a cancel that came as it finished)
            grace = self._graces.pop(rec.job_id, None)
            if grace is not None:
                grace.cancel()
            self._on_over(rec, requeue)

    def _control_over(self, rec: JobRecord, ctl: AttemptControl,
                      extra: dict[str, Any]) -> None:
        """The attempt of a runner that accepts control is over: its time held counted."""
        self.controls.pop(rec.job_id, None)
        if ctl.paused_s > 0:
            extra["paused_s"] = round(ctl.paused_s, 3)
            rec.paused_s += ctl.paused_s

    def _resume(self, rec: JobRecord, ctx: ModuleCtx, stage: mf.Stage,
                workdir: Path) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """A runner that writes checkpoints: keep the one the previous attempt left (its group
        is ended by now), then give this attempt the job's last one (``checkpoints.py``).
        The spec's ``resume`` and the history entry's fields, or (None, {})."""
        job_dir = self.store.job_dir(rec.job_id)
        raw_stages = ctx.manifest.raw.get("stages")
        raw_stage = next((t for t in raw_stages if isinstance(t, dict)
                          and t.get("name") == stage.name), None) if isinstance(
                              raw_stages, list) else None
        budget = checkpoints.max_bytes(raw_stage)
        prev = rec.history[-1].get("attempt_id") if rec.history else None
        if isinstance(prev, str) and prev.rpartition(".")[2].isdigit():
            number = int(prev.rpartition(".")[2])
            if rec.checkpoint is None or rec.checkpoint.get("attempt") != number:
                kept, problem = checkpoints.take(job_dir / f"a{number}", number, budget)
                if problem is not None:
                    log.warning("job %s: attempt %d: %s", rec.job_id, number, problem)
                if kept is not None:
                    rec.checkpoint = kept
        if rec.checkpoint is None:
            return None, {}
        problem = checkpoints.restore(job_dir, rec.checkpoint, workdir)
        if problem is not None:
            log.warning("job %s: not resumed from attempt %s's checkpoint: %s; it starts "
                        "afresh", rec.job_id, rec.checkpoint.get("attempt"), problem)
            return None, {}
        kept = rec.checkpoint
        log.info("job %s: resumes from attempt %d's checkpoint (%s)", rec.job_id,
                 kept["attempt"], kept["digest"])
        return ({"from_attempt": kept["attempt"], "digest": kept["digest"], "data": kept["data"]},
                {"resumed_from_attempt": kept["attempt"], "resume_digest": kept["digest"]})

    async def _died_under(self, marks: dict[str, tuple[int, Any]],
                          may_release: bool) -> dict[str, str]:
        """The reserved services that died while the attempt ran -> why. A service that dies
        kills its connections and its channel at once; a runner that saw its connection drop
        and exited may be reaped before the agent reads the channel's end, so a failure that
        could be released (``may_release``: not a success, not the job's own fault) waits
        briefly for that (at most 1 s, only while a channel is still open)."""
        sup = self.supervisor
        if not marks or not may_release:
            return {}
        open_ = [ch.closed for _n, ch in marks.values() if ch is not None
                 and not ch.closed.done()]
        if open_:
            await asyncio.wait(open_, timeout=1.0)
        died = {}
        for key, (deaths, ch) in marks.items():
            rt = sup.services[key]
            if rt.deaths != deaths or (ch is not None and ch.closed.done()):
                died[key] = (ch.closed.result() if ch is not None and ch.closed.done()
                             else rt.st.error or "it failed")
        return died

    def cancel_unrun(self, rec: JobRecord, reason: str) -> None:
        """A job with no run in progress ends cancelled (the portal took it back)."""
        # queued|admitted -> cancelled
        self._finish(rec, jobs.Event.CANCEL, None, reason)

    def fail(self, rec: JobRecord, reason: str) -> None:
        """A queued job that will never run here fails (its module was removed)."""
        # queued -> failed
        self._finish(rec, jobs.Event.FAIL, None, reason)

    def _finish(self, rec: JobRecord, event: jobs.Event, exit_code: int | None,
                reason: str | None, result: dict[str, Any] | None = None) -> None:
        move(rec, event)
        rec.exit_code, rec.reason, rec.result = exit_code, reason, result
        rec.finished_at = time.time()
        self.store.save(rec)
        for f in self._done.pop(rec.job_id, []):
            if not f.done():
                f.set_result(None)
        for cb in list(self.on_final):
            try:
                cb(rec)
            except Exception:  # a listener's bug must not leave the run half-finished
                log.exception("job %s: a listener of its end failed", rec.job_id)
