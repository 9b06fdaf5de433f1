"""The agent: wiring of modules, supervisor, broker, admission, jobs and the control socket.

One asyncio loop. A job's life (each transition saved to its record before it matters):

    queued --(tokens taken: admission)--> admitted --(its services ready)--> running
    running --(exit 0 / 2 / 3 / other)--> succeeded | failed
    running --(exit 75, attempts left)--> admitted --> running ...
    any non-final --(agent stops)--> queued   (the record stays: a restarted agent resumes it)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from oarbank_sdk import manifest as mf

from . import (
    containment,
    control,
    escapewatch,
    faults,
    gpu_detect,
    manualwatch,
    procs,
    protection,
    recovery,
    refusals,
    sandboxing,
    waiting,
)
from . import lifecycle as lc
from .admission import Admission, Request
from .guard import DEFAULT_BUDGET_FRACTION, Guard, GuardConfig
from .modules import ModuleCtx, NodeInfo, load_module
from .runner import run_attempt
from .store import TERMINAL, JobRecord, JobStore
from .supervisor import Supervisor, service_key

__all__ = ["Agent", "ModuleSpec"]

log = logging.getLogger("oarbank_agent")

ModuleSpec = tuple[Path, dict[str, Any]]  # (module dir, settings)


class Agent:
    def __init__(self, state_dir: Path, node_id: str | None = None) -> None:
        self.state_dir = state_dir.resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.node = NodeInfo.create(self.state_dir, node_id)
        self.registry = procs.ProcessRegistry(self.state_dir)
        self.store = JobStore(self.state_dir)
        self.supervisor = Supervisor(self.node, self.registry)
        self.admission = Admission()
        self.modules: dict[str, ModuleCtx] = {}
        self.jobs: dict[str, JobRecord] = {}
        self._job_tasks: dict[str, asyncio.Task[None]] = {}
        self._job_done: dict[str, list[asyncio.Future[None]]] = {}
        self.on_change: list[Callable[[str], None]] = []  # heartbeat hook: service key changed
        self.heartbeat: Any = None  # the HeartbeatSender when there is a portal (its status)
        self.supervisor.on_change.append(self._service_changed)
        self.supervisor.on_capacity.append(self._capacity_changed)
        self.control = control.ControlServer(self.state_dir / control.SOCKET_NAME, self._request)
        self.broker: Any = None
        self._stop = asyncio.Event()
        # Host protection (guard.py): the CLI may replace the config and set ``gpu`` (an
        # override) before ``run``; otherwise the GPU APIs are detected at start.
        self.guard = Guard(self, GuardConfig(protection.Floors()))
        self.gpu: gpu_detect.Detection | None = None
        self._releasing: dict[str, str] = {}  # job id -> why its task is being cancelled
        # Manual services are fingerprinted again this often (manualwatch; the CLI may set it).
        self.manual_refresh_s = manualwatch.DEFAULT_INTERVAL_S
        self._manual_task: asyncio.Task[None] | None = None
        self._escape_task: asyncio.Task[None] | None = None  # escapewatch
        # Test-only fault injection (faults.py; the CLI sets it from OARBANK_AGENT_FAULT).
        self.fault: str | None = None

    # --- modules --------------------------------------------------------------------------

    def load_modules(self, specs: list[ModuleSpec]) -> list[str]:
        """Load every module it can; an invalid one is refused with the checker's messages.
        Returns the messages of the refused ones."""
        refused = []
        for path, settings in specs:
            try:
                ctx = load_module(path, self.state_dir, settings)
            except mf.ManifestError as exc:
                refused.append(str(exc))
                continue
            except OSError as exc:
                refused.append(f"{path}: cannot load: {exc}")
                continue
            if ctx.id in self.modules:
                refused.append(f"{path}: module {ctx.id} is already loaded from "
                               f"{self.modules[ctx.id].manifest.bundle}")
                continue
            self.modules[ctx.id] = ctx
            self.supervisor.add_module(ctx)
        return refused

    def find_module(self, name: str) -> ModuleCtx | None:
        if name in self.modules:
            return self.modules[name]
        matches = [m for m in self.modules.values() if m.manifest.short_name == name]
        return matches[0] if len(matches) == 1 else None

    # --- report (heartbeat, status) -------------------------------------------------------

    def report(self) -> dict[str, Any]:
        return {"node_id": self.node.node_id, "hostname": self.node.hostname,
                "time": time.time(),
                "services": [self.supervisor.row(rt) for rt in self.supervisor.services.values()],
                # node-level: what confines every job and service here (measured, see sandboxing)
                "sandbox": sandboxing.current().report(),
                # network attempts the sandbox refused, per service / attempt (refusals.py);
                # "counted" false: refused all the same, but this machine cannot count them
                "sandbox_refusals": refusals.current().report(),
                "sandbox_refusals_counted": refusals.current().enabled}

    def status(self) -> dict[str, Any]:
        rep = self.report()
        rep["jobs"] = [r.summary() for r in sorted(self.jobs.values(),
                                                   key=lambda r: (r.submitted_at, r.seq))]
        rep["state_dir"] = str(self.state_dir)
        rep["gpu"] = self.gpu.as_dict() if self.gpu is not None else None
        rep["protection"] = self.guard.report()
        rep.update(containment.current().report())  # cgroup | process-group, and why
        rep["fault"] = self.fault  # test-only fault injection: never on silently
        # what the portal did with this node's reports (refusals by cause: heartbeat.py)
        rep["heartbeat"] = self.heartbeat.status() if self.heartbeat is not None else None
        return rep

    def _service_changed(self, key: str) -> None:
        for cb in list(self.on_change):
            try:
                cb(key)
            except Exception:
                log.exception("on_change listener failed")

    def _capacity_changed(self, key: str) -> None:
        rt = self.supervisor.services[key]
        for pool, n in self.supervisor.capacities(key).items():
            self.admission.set_capacity(f"{rt.ctx.id}/{pool}", n)
        self._admit()

    # --- running --------------------------------------------------------------------------

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        from .broker import Broker  # the broker engineer's module

        self.supervisor.idle_stop = self.fault != faults.NO_IDLE_STOP
        self.supervisor.bare_start_errors = self.fault == faults.BARE_START_ERRORS
        if self.fault == faults.FLAT_BACKOFF:
            for rt in self.supervisor.services.values():
                rt.st = dataclasses.replace(rt.st, backoff_max_s=rt.st.backoff_initial_s)
        if self.fault is not None:
            log.warning("!!! %s !!!", faults.describe(self.fault))
        if self.fault == faults.KEEP_PREDECESSOR_GROUPS:
            kept: dict[str, procs.GroupRecord] = {}  # fault injection: nothing is ended
        else:
            # A previous agent's groups: ended, except services that may be adopted (recovery.py)
            kept = await recovery.end_leftovers(self.registry, self.supervisor)
        self.broker = Broker(self.supervisor)
        self.supervisor.broker = self.broker
        await self._place_gpu_services()
        if self.guard.config.budget_gb is not None:
            self.admission.budget_gb = self.guard.config.budget_gb
        else:
            total_gb = psutil.virtual_memory().total / 2**30
            self.admission.budget_gb = round(total_gb * DEFAULT_BUDGET_FRACTION, 2)
        await asyncio.gather(*(self.supervisor.fingerprint(rt)
                               for rt in self.supervisor.services.values()))
        await recovery.adopt_running(self.registry, self.supervisor, kept)
        self._recover_jobs()
        await self.control.start()
        self.guard.sample()  # the first sample before anything starts
        self.guard.start()
        self._manual_task = manualwatch.start(self.supervisor, self.manual_refresh_s)
        self._escape_task = escapewatch.start(self.registry)  # sandboxed groups stay confined
        for rt in self.supervisor.services.values():
            self.supervisor.poke(rt)  # `always` services start now
        self._admit()
        if ready:
            ready()
        try:
            await self._stop.wait()
        finally:
            await self.shutdown()

    def request_stop(self) -> None:
        self._stop.set()

    async def shutdown(self) -> None:
        await self.guard.aclose()
        if self._manual_task is not None:
            self._manual_task.cancel()
            await asyncio.gather(self._manual_task, return_exceptions=True)
        if self._escape_task is not None:
            self._escape_task.cancel()
            await asyncio.gather(self._escape_task, return_exceptions=True)
        await self.control.close()
        tasks = list(self._job_tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.supervisor.shutdown()
        if self.broker is not None:
            await self.broker.aclose()
        containment.current().close()  # every group is ended: its cgroups are empty

    def _recover_jobs(self) -> None:
        records = self.store.load_all()
        # Attempt numbers on the channel continue after an earlier agent's, so a number in
        # status (and in a service's log) names one attempt of this state dir only.
        used = [n for rec in records
                for n in (rec.wire_attempt, *(h.get("wire_attempt") for h in rec.history))
                if isinstance(n, int)]
        if used and self.broker is not None:
            self.broker.continue_wire_attempts_after(max(used))
        for rec in records:
            self.jobs[rec.job_id] = rec
            if rec.state in TERMINAL:
                continue
            ctx = self.modules.get(rec.module)
            if ctx is None or ctx.manifest.stage(rec.stage) is None:
                log.warning("job %s: module %s / stage %s is not loaded; left queued",
                            rec.job_id, rec.module, rec.stage)
                continue
            # running|admitted (previous agent) -> queued; an interrupted attempt is not charged
            if recovery.uncharge_interrupted(rec):
                log.warning("job %s: its attempt was interrupted by the agent stopping; "
                            "requeued without charge", rec.job_id)
            rec.state = "queued"
            self.store.save(rec)
            self._enqueue(rec, ctx)

    def submit(self, module: str, stage: str, payload: dict[str, Any]) -> JobRecord:
        ctx = self.find_module(module)
        if ctx is None:
            known = ", ".join(sorted(self.modules)) or "none"
            raise control.ControlError("unknown_module",
                                       f"unknown module {module!r} (loaded: {known})")
        st = ctx.manifest.stage(stage)
        if st is None:
            known = ", ".join(s.name for s in ctx.manifest.stages) or "none"
            raise control.ControlError("unknown_stage", f"module {ctx.id} has no stage "
                                       f"{stage!r} (stages: {known})")
        self._check_placement(ctx, st)
        # (new) -> queued: on disk before anyone hears of it
        rec = self.store.create(ctx.id, st.name, payload)
        self.jobs[rec.job_id] = rec
        self._enqueue(rec, ctx)
        self._admit()
        return rec

    def _enqueue(self, rec: JobRecord, ctx: ModuleCtx, *, front: bool = False) -> None:
        st = ctx.manifest.stage(rec.stage)
        assert st is not None
        services_mem: dict[str, float] = {}
        gpu: str | None = None
        for key in self._service_keys(ctx, st):
            rt = self.supervisor.services[key]
            if rt.svc.reserves_host_memory:
                services_mem[key] = rt.fp_reserve_gb
            if rt.svc.gpu.use != "none":
                # A job reserving a GPU service's pool is a GPU job.
                gpu = "exclusive" if "exclusive" in (gpu, rt.svc.gpu.use) else rt.svc.gpu.use
        self.admission.enqueue(Request(
            rec.job_id, {f"{ctx.id}/{p}": n for p, n in st.pools.items()},
            tuple(f"{ctx.id}/{p}" for p in st.needs_pools), mem_gb=st.mem_gb or 0.0,
            services_mem=services_mem, gpu=gpu), front=front)

    # --- host protection: placement, memory budget, releasing jobs (guard.py acts) ---------

    async def _place_gpu_services(self) -> None:
        """GPU APIs (detected, each probe under a watchdog, unless overridden): a service
        whose ``apis_any`` the host lacks is not offered here (its pools do not exist)."""
        if self.gpu is None:
            self.gpu = await asyncio.to_thread(gpu_detect.detect)
        log.info("GPU APIs (%s): %s", self.gpu.source, ", ".join(self.gpu.apis) or "none")
        for rt in self.supervisor.services.values():
            rt.gpu_missing = protection.gpu_api_missing(rt.svc.gpu.apis_any, self.gpu.apis)

    def _check_placement(self, ctx: ModuleCtx, st: mf.Stage) -> None:
        """Refuse at once a job that can never run on this node (nothing is queued)."""
        for pool in (*st.pools, *st.needs_pools):
            svc = ctx.manifest.service_for_pool(pool)
            rt = self.supervisor.services.get(service_key(ctx.id, svc.name)) if svc else None
            if rt is not None and rt.gpu_missing is not None:
                raise control.ControlError("gpu_api_missing", rt.gpu_missing)
        budget = self.admission.budget_gb
        need = (st.mem_gb or 0.0) + sum(
            self.supervisor.services[k].fp_reserve_gb for k in self._service_keys(ctx, st)
            if self.supervisor.services[k].svc.reserves_host_memory)
        if budget is not None and need > budget + 1e-9:
            raise control.ControlError(
                "exceeds_memory_budget",
                f"MEMORY_BUDGET: needs {need:g} GB; this node's budget is {budget:g} GB")

    def _charge_services(self) -> None:
        """Reserving services charge the budget while they run or have users."""
        up = ("starting", "ready", "stopping")
        self.admission.service_charges = {
            key: rt.fp_reserve_gb for key, rt in self.supervisor.services.items()
            if rt.svc.reserves_host_memory and (rt.st.state.value in up or rt.st.users > 0)}

    def users_of(self, key: str) -> list[str]:
        """Admitted jobs holding a pool of service ``key``."""
        rt = self.supervisor.services[key]
        pools = {f"{rt.ctx.id}/{p}" for p in rt.svc.pools}
        return [r.job_id for r in self.admission.holding() if pools & set(r.pools)]

    def running_job_groups(self) -> dict[str, int]:
        """Running job id -> its runner's process group."""
        out = {}
        for g in self.registry.records():
            job_id = g.label.rsplit(".", 1)[0]
            if g.kind == "runner" and job_id in self.jobs and self.jobs[job_id].state == "running":
                out[job_id] = g.pgid
        return out

    def release_jobs(self, job_ids: list[str], reason: str) -> None:
        """End these jobs' attempts and requeue them, charging no attempt (host protection)."""
        for job_id in job_ids:
            task = self._job_tasks.get(job_id)
            if task is None or task.done() or job_id in self._releasing:
                continue
            log.warning("job %s released (%s): requeued", job_id, reason)
            self._releasing[job_id] = reason
            task.cancel()

    def admit(self) -> None:
        self._admit()

    def _admit(self) -> None:
        if self._stop.is_set():
            return
        self._charge_services()
        for req in self.admission.admit():
            rec = self.jobs[req.job_id]
            # queued -> admitted (tokens taken)
            rec.state = "admitted"
            if (rec.reason or "").startswith(waiting.WAITING):
                rec.reason = None  # no longer waiting for its service
            self.store.save(rec)
            self._job_tasks[rec.job_id] = asyncio.create_task(self._run_job(rec),
                                                              name=f"job {rec.job_id}")
        self._update_users()
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
        why = waiting.service_wait_reason(self.supervisor, ctx, stage)
        if why is None and not (rec.reason or "").startswith(waiting.WAITING):
            return
        if why != rec.reason:
            rec.reason = why
            self.store.save(rec)

    def _update_users(self) -> None:
        for key, rt in self.supervisor.services.items():
            users = sum(self.admission.holders(f"{rt.ctx.id}/{p}") for p in rt.svc.pools)
            self.supervisor.set_users(key, users)

    def _service_keys(self, ctx: ModuleCtx, stage: mf.Stage) -> list[str]:
        keys = []
        for pool in stage.pools:
            svc = ctx.manifest.service_for_pool(pool)
            if svc is not None and service_key(ctx.id, svc.name) not in keys:
                keys.append(service_key(ctx.id, svc.name))
        return keys

    async def _run_job(self, rec: JobRecord) -> None:
        ctx = self.modules[rec.module]
        stage = ctx.manifest.stage(rec.stage)
        assert stage is not None
        requeue = False
        attempt_id: str | None = None
        started = 0.0
        try:
            while True:
                for key in self._service_keys(ctx, stage):
                    if not await self.supervisor.await_ready(key):
                        if self._stop.is_set():
                            raise asyncio.CancelledError
                        rt = self.supervisor.services[key]
                        why = rt.st.error or rt.st.state.value
                        if rt.st.state is lc.State.WITHDRAWN or rt.held is not None:
                            # admitted -> queued: it waits (readably) for the service to return
                            self._releasing[rec.job_id] = (
                                f"service {key} is {rt.held or 'withdrawn'} ({why})")
                            raise asyncio.CancelledError
                        self._finish(rec, "failed", None,
                                     f"service_unavailable: {key} is {rt.st.state.value} ({why})")
                        return
                # admitted -> running
                rec.attempts += 1
                rec.state = "running"
                # Released attempts keep their numbers: ids and workdirs are never reused.
                number = rec.attempts + rec.released
                attempt_id = f"{rec.job_id}.{number}"
                # The number services see for this attempt (run_attempt ends it in the broker).
                rec.wire_attempt = self.broker.wire_attempt(attempt_id)
                workdir = self.store.job_dir(rec.job_id) / f"a{number}"
                started = time.time()
                rec.started_at = rec.started_at or started
                self.store.save(rec)
                outcome = await run_attempt(ctx, self.node, stage, job_id=rec.job_id,
                                            payload=rec.payload, attempt_id=attempt_id,
                                            workdir=workdir, broker=self.broker,
                                            registry=self.registry)
                rec.history.append({"attempt": rec.attempts, "attempt_id": attempt_id,
                                    "wire_attempt": rec.wire_attempt, "started_at": started,
                                    "finished_at": time.time(),
                                    "outcome": outcome.state, "exit_code": outcome.exit_code,
                                    "reason": outcome.reason, "fault": outcome.fault})
                if outcome.state == "retry" and rec.attempts < stage.max_attempts:
                    # running -> admitted (transient failure, attempts left; tokens kept)
                    rec.state = "admitted"
                    rec.exit_code, rec.reason = outcome.exit_code, outcome.reason
                    self.store.save(rec)
                    continue
                final = "succeeded" if outcome.state == "succeeded" else "failed"
                reason = outcome.reason
                if outcome.state == "retry":
                    reason = f"{reason} (gave up after {rec.attempts} attempts)"
                # running -> succeeded | failed
                self._finish(rec, final, outcome.exit_code, reason, outcome.result)
                return
        except asyncio.CancelledError:
            released_for = self._releasing.pop(rec.job_id, "")
            if not released_for or self._stop.is_set():
                # admitted|running -> queued: the agent is stopping; the job is resumed later.
                rec.state = "queued"
                self.store.save(rec)
                raise
            # admitted|running -> queued (released by host protection): the attempt is over,
            # it is not charged and not a failure; the job goes back ahead of later ones.
            if rec.state == "running":
                if self.fault != faults.CHARGE_RELEASED:  # (the fault: test only)
                    rec.attempts -= 1
                rec.released += 1
                rec.history.append({"attempt": None, "attempt_id": attempt_id,
                                    "wire_attempt": rec.wire_attempt, "started_at": started,
                                    "finished_at": time.time(),
                                    "outcome": "released", "exit_code": None,
                                    "reason": released_for, "fault": None})
            rec.state, rec.reason = "queued", f"released: {released_for}"
            self.store.save(rec)
            requeue = True
        finally:
            self._job_tasks.pop(rec.job_id, None)
            self.admission.release(rec.job_id)
            if requeue:
                self._enqueue(rec, ctx, front=True)
            if not self._stop.is_set():
                self._admit()
            self._update_users()

    def _finish(self, rec: JobRecord, state: str, exit_code: int | None, reason: str | None,
                result: dict[str, Any] | None = None) -> None:
        rec.state, rec.exit_code, rec.reason, rec.result = state, exit_code, reason, result
        rec.finished_at = time.time()
        self.store.save(rec)
        for f in self._job_done.pop(rec.job_id, []):
            if not f.done():
                f.set_result(None)

    # --- control requests -----------------------------------------------------------------

    async def _request(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "submit":
            if self._stop.is_set():
                raise control.ControlError("shutting_down", "the agent is stopping")
            module, stage, payload = req.get("module"), req.get("stage"), req.get("payload")
            if not isinstance(module, str) or not isinstance(stage, str):
                raise control.ControlError("bad_request", "submit needs 'module' and 'stage'")
            if not isinstance(payload, dict):
                raise control.ControlError("bad_request", "'payload' must be a JSON object")
            rec = self.submit(module, stage, payload)
            return {"ok": True, "job_id": rec.job_id}
        if op in ("wait", "job"):
            rec = self._job(req.get("job_id"))
            if op == "wait" and rec.state not in TERMINAL:
                timeout = req.get("timeout")
                if timeout is not None and (not isinstance(timeout, (int, float))
                                            or isinstance(timeout, bool) or timeout < 0):
                    raise control.ControlError("bad_request", "'timeout' must be seconds >= 0")
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._job_done.setdefault(rec.job_id, []).append(fut)
                try:
                    await asyncio.wait_for(fut, timeout)
                except asyncio.TimeoutError:
                    return {"ok": False, "code": "timeout", "job": rec.public(),
                            "error": f"job {rec.job_id} not finished after {timeout:g}s "
                                     f"(state: {rec.state})"}
            return {"ok": True, "job": rec.public()}
        if op == "status":
            return {"ok": True, "status": self.status()}
        if op == "protect":
            rule = req.get("rule")
            if rule is not None:
                try:
                    self.guard.set_rule(str(rule))
                except ValueError as exc:
                    raise control.ControlError("bad_request", str(exc)) from None
            return {"ok": True, "rules": self.guard.rules(),
                    "held": {k: rt.held for k, rt in self.supervisor.services.items()
                             if rt.held is not None}}
        raise control.ControlError("bad_request", f"unknown op {op!r}")

    def _job(self, job_id: Any) -> JobRecord:
        if not isinstance(job_id, str) or job_id not in self.jobs:
            raise control.ControlError("unknown_job", f"no job {job_id!r}")
        return self.jobs[job_id]


def configure_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")

