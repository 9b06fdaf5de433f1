"""The run of an admitted job: wait for its services, run attempts, retry, finish or release.

One task per admitted job (``JobRuns.start``). The job's states and their table are in
``jobs.py``; every transition here is labelled where it happens and goes through
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
- When a run is over (any way), ``on_over(record, requeued)`` gives its tokens back: admission
  is the agent's, not this module's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from oarbank_agent.jobs import machine as jobs
from oarbank_agent.jobs import runnerevents
from oarbank_agent.jobs.runner import run_attempt
from oarbank_agent.jobs.store import JobRecord, JobStore
from oarbank_agent.services import lifecycle as lc

if TYPE_CHECKING:
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
                 charge_released: bool = False) -> None:
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
        # Modules being removed -> why (JobQueue.closed): no new attempt of theirs starts.
        self.closed: dict[str, str] = {}

    # --- starting, waiting, releasing ------------------------------------------------------

    def start(self, rec: JobRecord, ctx: ModuleCtx) -> None:
        self.tasks[rec.job_id] = asyncio.create_task(self._run(rec, ctx), name=f"job {rec.job_id}")

    def when_final(self, job_id: str) -> asyncio.Future[None]:
        """A future resolved when the job finishes (succeeded or failed)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._done.setdefault(job_id, []).append(fut)
        return fut

    def release(self, job_ids: Iterable[str], reason: str) -> None:
        """End these jobs' attempts and requeue them, charging no attempt (host protection)."""
        for job_id in job_ids:
            task = self.tasks.get(job_id)
            if task is None or task.done() or job_id in self._releasing:
                continue
            log.warning("job %s released (%s): requeued", job_id, reason)
            self._releasing[job_id] = reason
            task.cancel()

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
                outcome = await run_attempt(ctx, self.node, stage, job_id=rec.job_id,
                                            payload=rec.payload, attempt_id=attempt_id,
                                            workdir=workdir, broker=self.broker,
                                            registry=self.registry,
                                            # `running` on disk, right after the fork (in
                                            # the task step the factory's answer wakes, so
                                            # before any connect of the runner is read)
                                            on_spawned=lambda: self.store.save(rec))
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
                                    "reason": outcome.reason, "fault": outcome.fault,
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
            released_for = self._releasing.pop(rec.job_id, "")
            if not released_for or self._stopping.is_set():
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
                                    "reason": released_for, "fault": None})
            move(rec, jobs.Event.RELEASE)
            rec.reason = f"released: {released_for}"
            self.store.save(rec)
            requeue = True
        finally:
            self.tasks.pop(rec.job_id, None)
            self._on_over(rec, requeue)

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
