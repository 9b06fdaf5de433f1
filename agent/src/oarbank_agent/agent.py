"""The agent: wiring of modules, supervisor, broker, admission, jobs and the control socket.

One asyncio loop. A job's states and their table are in ``jobs.py``; from submit to its run
(records, queue, admission, users) in ``jobqueue.py``; its run (attempts, retries, finishing,
releasing) in ``jobrun.py``; where it stands against the node's services in ``placement.py``.
This module builds the parts from one ``AgentConfig``, connects their callbacks, applies host
protection's actions and answers the control socket.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oarbank_agent import eventwait, factory, faults, platform, procs, recovery
from oarbank_agent.broker.channel import Channels
from oarbank_agent.broker.handover import Broker
from oarbank_agent.host import gpuapis, memory
from oarbank_agent.jobs import machine as jobs
from oarbank_agent.jobs import runnerhealth, waiting
from oarbank_agent.jobs.admission import Admission
from oarbank_agent.jobs.queue import JobQueue
from oarbank_agent.jobs.store import JobRecord, JobStore
from oarbank_agent.modules import compat
from oarbank_agent.modules import remove as moduleremove
from oarbank_agent.modules import state as modulestate
from oarbank_agent.modules.loaded import ModuleCtx, ModuleRefused, NodeInfo, load_module, module_names
from oarbank_agent.operate import control, drain, reload
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
    Pause,
    ReleaseGpuJobs,
    ReleaseJobs,
)
from oarbank_agent.sandbox import containment, escapewatch, refusals, resourcelimits
from oarbank_agent.sandbox import policy as sandboxing
from oarbank_agent.services import detachedwatch, manualwatch, ownedwatch, runningwatch
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services.supervisor import Supervisor
from oarbank_agent.services.supervisor import details as supervisor_details
from oarbank_sdk import manifest as mf

__all__ = ["Agent", "AgentConfig", "ModuleSpec"]

log = logging.getLogger("oarbank_agent")

ModuleSpec = tuple[Path, dict[str, Any] | None]  # (module dir, settings; None: keep the file)


@dataclass
class AgentConfig:
    """Everything ``oarbank-agent run`` decides before the agent exists (cli.cmd_run)."""

    state_dir: Path
    node_id: str | None = None  # default: the host name
    # Host protection (guard.py): floors, sample period, memory budget.
    guard: GuardConfig = field(default_factory=lambda: GuardConfig(protection.Floors()))
    gpu: gpuapis.Detection | None = None  # an override (--gpu-apis); None: detect at start
    # Manual services are fingerprinted again this often (manualwatch).
    manual_refresh_s: float = manualwatch.DEFAULT_INTERVAL_S
    # First interval of the sparse `status` polls (detachedwatch).
    status_poll_s: float = detachedwatch.DEFAULT_FIRST_S
    fault: str | None = None  # test-only fault injection (faults.py; OARBANK_AGENT_FAULT)
    # A stop request / `drain`: running attempts get this long to finish (drain.py; --drain-s).
    drain_s: float = 30.0
    # Final job records (and their workdirs) are removed this long after they finished
    # (--keep-jobs-s): the state dir of a busy node stays bounded.
    keep_jobs_s: float = 7 * 86400.0
    # Running services are fingerprinted again this often, and once right after each becomes
    # ready (runningwatch; --refresh-s).
    refresh_s: float = runningwatch.DEFAULT_INTERVAL_S


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.state_dir = config.state_dir.resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.node = NodeInfo.create(self.state_dir, config.node_id)
        self.registry = procs.ProcessRegistry(self.state_dir)
        self.store = JobStore(self.state_dir)
        # The endpoint channels: the supervisor opens one per start, the broker hands
        # connections over through them; both get the table, neither holds the other.
        channels = Channels()
        self.supervisor = Supervisor(self.node, self.registry, channels=channels,
                                     status_poll_s=config.status_poll_s)
        self.broker = Broker(self.supervisor, channels=channels)
        self.admission = Admission()
        self.modules: dict[str, ModuleCtx] = {}
        self._limits_known = False  # resource limits are set up at run(): warned from then
        self.refused: dict[str, str] = {}  # a refused module's names -> why (load_modules)
        # each refused module once (its id, or its folder when the manifest is invalid) -> why:
        # `status` lists them, so nobody has to find the line the agent printed at start
        self.refused_modules: dict[str, str] = {}
        self.compat = compat.Node(self.node.platform)  # what manifests are matched against
        # Modules the operator disabled or added here (module disable / add), kept across
        # restarts; self.disabled is the kept set itself.
        self.kept, problem = modulestate.read(self.state_dir)
        self.disabled = self.kept.disabled
        if problem is not None:
            log.warning("%s", problem)
        self._stop = asyncio.Event()
        self.queue = JobQueue(store=self.store, supervisor=self.supervisor,
                              admission=self.admission, broker=self.broker,
                              registry=self.registry, node=self.node, modules=self.modules,
                              stopping=self._stop,
                              charge_released=config.fault == faults.CHARGE_RELEASED)
        self.jobs: dict[str, JobRecord] = self.queue.jobs  # every job this agent knows
        # module remove (moduleremove.py): removals in progress, and the names of removed
        # modules -> what a submit to one answers; their unfinished jobs fail
        self.removing: dict[str, asyncio.Task[list[str]]] = {}
        self.gone: dict[str, str] = {}
        self.queue.closed.update({m: moduleremove.failure_reason(m) for m in self.kept.removed})
        # module id -> what its runner's `doctor --json` said last (runnerhealth.py)
        self.runner_health = self.queue.runner_health
        self.on_change: list[Callable[[str], None]] = []  # heartbeat hook: service key changed
        self.heartbeat: Any = None  # the HeartbeatSender when there is a portal (its status)
        self.supervisor.on_change.append(self._service_changed)
        self.supervisor.on_capacity.append(self._capacity_changed)
        self.control = control.ControlServer(self.state_dir / control.SOCKET_NAME, self._request)
        # Host protection (guard.py) samples and reports; the agent applies (``_protect``).
        # The GPU APIs are detected at start unless overridden.
        self.guard = Guard(config.guard, self.supervisor,
                           running_jobs=self.queue.running_job_groups, report=self._protect)
        self.gpu: gpuapis.Detection | None = config.gpu
        self.manual_refresh_s = config.manual_refresh_s
        self._manual_task: asyncio.Task[None] | None = None
        self._escape_task: asyncio.Task[None] | None = None  # escapewatch
        self._prune_task: asyncio.Task[None] | None = None  # _prune_jobs
        self.refresher = runningwatch.Refresher(self.supervisor, config.refresh_s,
                                                also=self.check_runners)
        # list_owned / destroy --force for objects of attempts that are over (G6)
        self.reaper = ownedwatch.Reaper(self.supervisor, self.broker.wire_attempts)
        self.queue.runs.on_attempt_end = self.reaper.poke
        self.fault: str | None = config.fault
        self.stop_reason: str | None = None  # a stop request (its name), a drain (logged)
        # Re-reads the config and settings files (cli.py); None: `reload` has nothing to read.
        self.reload_source: Callable[[], reload.Reloaded] | None = None
        self._reloading: asyncio.Task[Any] | None = None
        self._hurry = asyncio.Event()  # a second stop request: the drain waits no longer

    # --- modules --------------------------------------------------------------------------

    def _warn_unmet_limits(self, ctx: ModuleCtx) -> None:
        for line in resourcelimits.unmet(resourcelimits.current(), ctx.manifest):
            log.warning("%s", line)

    def load_modules(self, specs: list[ModuleSpec], *, adding: bool = False) -> list[str]:
        """Load every module it can; an invalid one is refused with the checker's messages.
        A module removed here (module remove) is not loaded unless ``adding`` (module add).
        Returns the messages of the refused ones."""
        refused = []

        def cannot_run(m: mf.Manifest) -> str | None:
            if m.id in self.kept.removed and not adding:
                raise _Removed(m.id, str(m.bundle))
            why = compat.module_refusals(m, self.compat)
            return compat.refusal_line(m.id, str(path), why) if why else None

        for path, settings in specs:
            try:
                ctx = load_module(path, self.state_dir, settings, refuse=cannot_run)
            except (mf.ManifestError, ModuleRefused) as exc:
                refused.append(str(exc))
                line = "; ".join(str(exc).splitlines())
                key = exc.module_id if isinstance(exc, ModuleRefused) else str(path)
                self.refused_modules[key] = line
                for name in module_names(path):  # `submit` to it gives this refusal
                    self.refused[name] = line
                continue
            except OSError as exc:
                refused.append(f"{path}: cannot load: {exc}")
                continue
            except _Removed as gone:
                text = moduleremove.gone_text(gone.module_id, gone.bundle)
                log.info("%s: not loaded: %s", path, text)
                for name in module_names(path):
                    self.gone[name] = text
                continue
            if ctx.id in self.modules:
                refused.append(f"{path}: module {ctx.id} is already loaded from "
                               f"{self.modules[ctx.id].manifest.bundle}")
                continue
            self.modules[ctx.id] = ctx
            gpu_note = sandboxing.gpu_driver_note(ctx, sandboxing.current().enforce,
                                                  os.geteuid())
            if gpu_note is not None:
                log.warning("%s: %s", ctx.id, gpu_note)
            if self._limits_known:  # (at start: once run() knows what is enforced)
                self._warn_unmet_limits(ctx)
            if ctx.manifest.runner is not None:  # its jobs run until a doctor says otherwise
                self.admission.set_capacity(runnerhealth.pool_key(ctx.id), 1)
            for rt in self.supervisor.add_module(ctx):
                if ctx.id in self.disabled:  # still disabled after a restart: never started
                    self.supervisor.set_disabled(rt.key, True, live=False)
        return refused

    async def check_runners(self, ctxs: list[ModuleCtx] | None = None) -> None:
        """Each runner's ``doctor --json`` (runnerhealth.py): at load and every refresh. An
        unhealthy or undetected one's jobs are not admitted (its pseudo pool counts 0) and say
        why."""
        for ctx in list(self.modules.values()) if ctxs is None else ctxs:
            if ctx.manifest.runner is None or ctx.id in self.removing:
                continue
            h = await runnerhealth.doctor(ctx, self.node, self.registry)
            if self.modules.get(ctx.id) is not ctx or ctx.id in self.removing:
                continue  # removed meanwhile
            before = self.runner_health.get(ctx.id)
            self.runner_health[ctx.id] = h
            self.admission.set_capacity(runnerhealth.pool_key(ctx.id),
                                        0 if h.health in runnerhealth.HOLDS_JOBS else 1)
            if before is None or (before.health, before.reason) != (h.health, h.reason):
                # undetected: the runner's own "not on this node", no alarm (contract 4)
                quiet = h.health in ("healthy", "undetected")
                log.log(logging.INFO if quiet else logging.WARNING,
                        "%s: runner %s%s", ctx.id, h.health, f": {h.reason}" if h.reason else "")
        self.queue.admit()

    def find_module(self, name: str) -> ModuleCtx | None:
        if name in self.modules:
            return self.modules[name]
        matches = [m for m in self.modules.values() if m.manifest.short_name == name]
        return matches[0] if len(matches) == 1 else None

    # --- report (heartbeat, status) -------------------------------------------------------

    def report(self) -> dict[str, Any]:
        return {"node_id": self.node.node_id, "hostname": self.node.hostname,
                "time": time.time(),
                # what a module's [requires] is matched against here (compat.py)
                "agent_version": self.compat.agent, "core_version": self.compat.core,
                "platform": self.compat.platform,
                "services": [self.supervisor.row(rt) for rt in self.supervisor.services.values()],
                # node-level: what confines every job and service here (measured, see sandboxing)
                "sandbox": sandboxing.current().report(),
                # network attempts the sandbox refused, per service / attempt (refusals.py);
                # "counted" false: refused all the same, but this machine cannot count them
                "sandbox_refusals": refusals.current().report(),
                "sandbox_refusals_counted": refusals.current().enabled,
                # each runner's `doctor --json` verdict (runnerhealth.py): in every heartbeat,
                # so that a fleet sees an unhealthy runner, not only this node's `status`
                "runners": {m: h.report() for m, h in self.runner_health.items()}}

    def _with_wait(self, rec: JobRecord, view: dict[str, Any]) -> dict[str, Any]:
        """A job's view; an admitted job waiting for a starting service says so, with the
        seconds spent and allowed, or for a restart after a failed start, with the failure and
        the seconds to the next start (computed now: it is never stored)."""
        ctx = self.modules.get(rec.module)
        stage = ctx.manifest.stage(rec.stage) if ctx else None
        if rec.state == jobs.State.ADMITTED.value and not view.get("reason") and ctx and stage:
            view["reason"] = waiting.admitted_wait_reason(self.supervisor, ctx, stage,
                                                          time.monotonic(), time.time())
        return view

    def status(self, jobs_limit: int | None = None, jobs_page: int = 1) -> dict[str, Any]:
        """The report with jobs and node details. ``jobs_limit``: a page of that many jobs,
        page 1 the most recent (each page in submission order); None: every job."""
        rep = self.report()
        now = time.time()
        for r, rt in zip(rep["services"], self.supervisor.services.values(), strict=True):
            r.update(supervisor_details(rt, now))  # pid, uptime, idle stop, restarts
        ordered = sorted(self.jobs.values(), key=lambda r: (r.submitted_at, r.seq))
        rep["jobs_total"] = len(ordered)
        if jobs_limit is not None:
            end = max(0, len(ordered) - jobs_limit * (jobs_page - 1))
            ordered = ordered[max(0, end - jobs_limit):end]
            rep["jobs_page"] = {"page": jobs_page, "per_page": jobs_limit,
                                "pages": max(1, -(-rep["jobs_total"] // jobs_limit))}
        rep["jobs"] = [self._with_wait(r, r.summary()) for r in ordered]
        rep["state_dir"] = str(self.state_dir)
        rep["modules_refused"] = dict(self.refused_modules)  # module -> why it is not running
        rep["gpu"] = self.gpu.as_dict() if self.gpu is not None else None
        rep["protection"] = self.guard.report(self.admission.budget_gb,
                                              self.admission.charged_gb())
        rep.update(containment.current().report())  # its mode, and why
        # requires.resources as memory.max / cpu.max: enforced, or unavailable and why
        rep["resource_limits"] = resourcelimits.current().report()
        rep["fault"] = self.fault  # test-only fault injection: never on silently
        rep["process_factory"] = factory.report()  # on/off; its pid, RSS, descriptors
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
        rt = self.supervisor.services.get(key)
        if rt is None:  # an op that ended after its module was removed (module remove)
            return
        for pool, n in self.supervisor.capacities(key).items():
            self.admission.set_capacity(f"{rt.ctx.id}/{pool}", n)
        self.queue.admit()

    # --- running --------------------------------------------------------------------------

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        # Stop and reload requests (signals on POSIX): the backend's.
        platform.current().requests.install(loop, self.request_stop, self._reload_on_request)
        # Test-only faults: the lifecycle's inputs (decisions), and one effect (error text).
        self.supervisor.set_faults(idle_stop=self.fault != faults.NO_IDLE_STOP,
                                   flat_backoff=self.fault == faults.FLAT_BACKOFF)
        self.supervisor.bare_start_errors = self.fault == faults.BARE_START_ERRORS
        if self.fault is not None:
            log.warning("!!! %s !!!", faults.describe(self.fault))
        box = containment.current()  # one line: which resource limits are enforced here
        resourcelimits.install(resourcelimits.setup(box.base if box.enabled else None,
                                                    box.note))
        self._limits_known = True
        for ctx in self.modules.values():
            self._warn_unmet_limits(ctx)
        if self.fault == faults.KEEP_PREDECESSOR_GROUPS:
            kept: dict[str, procs.GroupRecord] = {}  # fault injection: nothing is ended
        else:
            # A previous agent's groups: ended, except services that may be adopted (recovery.py)
            kept = await recovery.end_leftovers(self.registry, self.supervisor)
        # Modules added at run time before a restart (module add; modules.json), unless the
        # command line loads the same folder.
        for path in self.kept.added:
            if not any(ctx.manifest.bundle == Path(path) for ctx in self.modules.values()):
                for msg in self.load_modules([(Path(path), None)]):
                    log.warning("module added earlier (%s) refused: %s", modulestate.FILE,
                                "; ".join(msg.splitlines()))
        await self._place_gpu_services()
        if self.guard.config.budget_gb is not None:
            self.admission.budget_gb = self.guard.config.budget_gb
        else:
            total_gb = memory.total_bytes() / 2**30
            self.admission.budget_gb = round(total_gb * DEFAULT_BUDGET_FRACTION, 2)
        await asyncio.gather(self.check_runners(),
                             *(self.supervisor.fingerprint(rt)
                               for rt in self.supervisor.services.values()))
        await recovery.adopt_running(self.registry, self.supervisor, kept)
        self.queue.recover()
        await self.control.start()
        # The host rules an operator set before a restart hold again (hostrules.py).
        kept, problem = hostrules.read(self.state_dir)
        if problem is not None:
            log.warning("%s", problem)
        for rule in hostrules.rules_to_apply(kept):
            log.info("host rule %s kept from before the restart", rule)
            self._protect(self.guard.set_rule(rule))
        self._protect(self.guard.sample())  # the first sample before anything starts
        self.guard.start()
        self._manual_task = manualwatch.start(self.supervisor, self.manual_refresh_s)
        self._escape_task = escapewatch.start(self.registry)  # sandboxed groups stay confined
        self._prune_task = asyncio.create_task(self._prune_jobs(), name="prune jobs")
        self.refresher.start()  # health and pools of running services follow them
        self.reaper.start()
        for rt in self.supervisor.services.values():
            self.supervisor.poke(rt)  # `always` services start now
        self.queue.admit()
        if ready:
            ready()
        try:
            await self._stop.wait()
            await drain.wait_running(self.queue.runs, self.jobs, self.config.drain_s,
                                     self.stop_reason or "stop", self._hurry)
        finally:
            await self.shutdown()

    async def _prune_jobs(self) -> None:
        """Final jobs older than --keep-jobs-s are removed: at start, then every half of it
        (at least every 10 minutes, at most every second)."""
        keep_s = self.config.keep_jobs_s
        while True:
            try:
                self.queue.prune(time.time(), keep_s)
            except OSError as exc:  # a folder we cannot remove: said, tried again later
                log.warning("removing old job records failed: %s", exc)
            await asyncio.sleep(min(600.0, max(1.0, keep_s / 2)))

    def request_stop(self, why: str = "stop") -> None:
        """Begin the drain (drain.py): nothing more is admitted from now on. Asked again
        while draining: the drain ends now (what still runs is released)."""
        if not self._stop.is_set():
            self.stop_reason = why
            log.info("stop requested (%s): draining", why)
        elif not self._hurry.is_set():
            self._hurry.set()
        self._stop.set()

    async def reload(self) -> list[str]:
        """Re-read config and settings, apply timings, fingerprint again (reload.py)."""
        if self.reload_source is None:
            raise control.ControlError("bad_request", "this agent has no config to reload")
        try:
            return await reload.reload(self, self.reload_source)
        except ValueError as exc:
            log.warning("reload refused, nothing changed: %s", exc)
            raise control.ControlError("bad_request", f"reload refused, nothing changed: "
                                       f"{exc}") from None

    def _reload_on_request(self, why: str) -> None:
        log.info("%s: reloading the config and settings", why)
        if self._reloading is not None and not self._reloading.done():
            return  # one at a time; the one in flight reads the files as they are now

        async def go() -> None:
            try:
                await self.reload()
            except control.ControlError:
                pass  # logged by reload

        self._reloading = asyncio.create_task(go(), name="reload")

    async def shutdown(self) -> None:
        await self.guard.aclose()
        if self._manual_task is not None:
            self._manual_task.cancel()
            await asyncio.gather(self._manual_task, return_exceptions=True)
        for task in (self._escape_task, self._prune_task, *self.removing.values()):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.refresher.aclose()
        await self.reaper.aclose()
        await self.control.close()
        left = list(self.queue.runs.tasks)
        await self.queue.runs.cancel_all()  # each job stays queued on disk for the next agent
        for job_id in left:  # drain step 3: an interrupted attempt is given back at once
            if recovery.uncharge_interrupted(self.jobs[job_id]):
                self.store.save(self.jobs[job_id])
        log.info("stopping %d service(s)", sum(1 for rt in self.supervisor.services.values()
                                                 if rt.st.state is not lc.State.STOPPED))
        await self.supervisor.shutdown()
        await self.broker.aclose()
        containment.current().close()  # every group is ended: what held them is empty
        log.info("stopped: every service and job process ended; exiting")

    def submit(self, module: str, stage: str, payload: dict[str, Any]) -> JobRecord:
        ctx = self.find_module(module)
        if ctx is None and module in self.gone:
            raise control.ControlError("unknown_module", self.gone[module])
        if ctx is not None and ctx.id in self.removing:
            raise control.ControlError("module_removed", moduleremove.removing_text(ctx.id))
        if ctx is None and module in self.refused:
            raise control.ControlError("unknown_module", f"module {module!r} was refused when "
                                       f"the agent started: {self.refused[module]}")
        if ctx is None:
            known = ", ".join(sorted(self.modules)) or "none"
            raise control.ControlError("unknown_module",
                                       f"unknown module {module!r} (loaded: {known})")
        if ctx.id in self.disabled:
            raise control.ControlError("module_disabled", _disabled_text(ctx.id))
        st = ctx.manifest.stage(stage)
        if st is None:
            known = ", ".join(s.name for s in ctx.manifest.stages) or "none"
            raise control.ControlError("unknown_stage", f"module {ctx.id} has no stage "
                                       f"{stage!r} (stages: {known})")
        why = compat.stage_refusal(ctx.manifest, st, self.compat.platform)
        if why is not None:  # it could never run here: nothing is queued
            raise control.ControlError("unsupported_platform", f"{ctx.id}: {why}")
        return self.queue.submit(ctx, st, payload)

    # --- host protection: GPU placement, and what guard.py reports ---------------------------

    async def _place_gpu_services(self) -> None:
        """GPU APIs (detected, each probe under a watchdog, unless overridden): a service
        whose ``apis_any`` the host lacks is not offered here (its pools do not exist)."""
        if self.gpu is None:
            self.gpu = await asyncio.to_thread(gpuapis.detect)
        log.info("GPU APIs (%s): %s", self.gpu.source, ", ".join(self.gpu.apis) or "none")
        for key, rt in self.supervisor.services.items():
            self.supervisor.set_gpu_missing(
                key, protection.gpu_api_missing(rt.svc.gpu.apis_any, self.gpu.apis))

    def _protect(self, actions: list[Action]) -> None:
        """Apply what host protection reports, in its order (guard.py decides, we act)."""
        for a in actions:
            if isinstance(a, Pause):
                self.admission.paused = a.reason  # nothing is admitted while set
            elif isinstance(a, AllowGpu):
                self.admission.gpu_allowed = a.allowed
            elif isinstance(a, ReleaseGpuJobs):
                self.queue.release([r.job_id for r in self.admission.holding() if r.gpu],
                                   a.reason)
            elif isinstance(a, ReleaseJobs):
                self.queue.release(list(a.job_ids), a.reason)
            elif isinstance(a, Hold):
                self.supervisor.set_hold(a.key, a.reason)
                if a.release_users and a.reason is not None:
                    # Released after the hold: its pools count 0 by now, nothing is readmitted.
                    self.queue.release(self.queue.users_of(a.key), a.reason)
            elif isinstance(a, Admit):
                self.queue.admit()

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
            if op == "wait" and rec.state not in jobs.TERMINAL:
                timeout = req.get("timeout")
                if timeout is not None and (not isinstance(timeout, (int, float))
                                            or isinstance(timeout, bool) or timeout < 0):
                    raise control.ControlError("bad_request", "'timeout' must be seconds >= 0")
                fut = self.queue.runs.when_final(rec.job_id)
                finished, _ = await eventwait.result_within(fut, timeout)
                if not finished:
                    view = _with_events(rec, self._with_wait(rec, rec.public()))
                    why = f"; {view['reason']}" if view.get("reason") else ""
                    return {"ok": False, "code": "timeout", "job": view,
                            "error": f"job {rec.job_id} not finished after {timeout:g}s "
                                     f"(state: {rec.state}{why})"}
            return {"ok": True, "job": _with_events(rec, self._with_wait(rec, rec.public()))}
        if op == "status":
            limit, page = req.get("jobs_limit"), req.get("jobs_page", 1)
            for name, v in (("jobs_limit", limit), ("jobs_page", page)):
                if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                    raise control.ControlError("bad_request", f"'{name}' must be an integer >= 1")
            return {"ok": True, "status": self.status(limit, page)}
        if op == "module":
            return await self._module_request(req)
        if op == "drain":
            self.request_stop("drain request")
            return {"ok": True, "draining": True, "drain_s": self.config.drain_s}
        if op == "reload":
            return {"ok": True, "changes": await self.reload()}
        if op == "protect":
            rule = req.get("rule")
            if rule is not None:
                try:
                    actions = self.guard.set_rule(str(rule))
                except ValueError as exc:
                    raise control.ControlError("bad_request", str(exc)) from None
                hostrules.write(self.state_dir, self.guard.rules())  # kept across restarts
                self._protect(actions)
            return {"ok": True, "rules": self.guard.rules(),
                    "held": {k: rt.held for k, rt in self.supervisor.services.items()
                             if rt.held is not None}}
        raise control.ControlError("bad_request", f"unknown op {op!r}")

    async def _module_request(self, req: dict[str, Any]) -> dict[str, Any]:
        """``module list | add | disable | enable`` (module_cli.py)."""
        action, name, now = req.get("action"), req.get("module"), req.get("now", False)
        if action == "list":
            return {"ok": True, "modules": self.module_list(), "refused": self.refused_modules}
        if action == "add":
            if not isinstance(req.get("path"), str):
                raise control.ControlError("bad_request", "module add: 'path' (a module "
                                           "folder) expected")
            await self.add_module(Path(req["path"]))
            return {"ok": True, "modules": self.module_list()}
        if action not in ("disable", "enable", "remove"):
            raise control.ControlError("bad_request", f"module: unknown action {action!r} "
                                       "(list, add, disable, enable, remove)")
        if not isinstance(name, str) or not isinstance(now, bool):
            raise control.ControlError("bad_request", "module: 'module' (a name) and 'now' "
                                       "(true or false) expected")
        ctx = self.find_module(name)
        if ctx is None:
            loaded = ", ".join(sorted(self.modules)) or "none"
            why = (self.gone[name] if name in self.gone else
                   f"module {name!r} was refused when the agent started: {self.refused[name]}"
                   if name in self.refused else f"unknown module {name!r} (loaded: {loaded})")
            raise control.ControlError("unknown_module", why)
        if action == "remove":
            return await self._remove_module(ctx, now, bool(req.get("wait", False)))
        if ctx.id in self.removing:
            raise control.ControlError("module_removed", moduleremove.removing_text(ctx.id))
        disable = action == "disable"
        if disable:
            self.disabled.add(ctx.id)
        else:
            self.disabled.discard(ctx.id)
        modulestate.write(self.state_dir, self.kept)  # before it takes effect
        keys = [k for k, rt in self.supervisor.services.items() if rt.ctx.id == ctx.id]
        if disable and now:
            # --now: its attempts are released (not charged) and wait for it to be enabled
            for key in keys:
                self.queue.release(self.queue.users_of(key), f"module {ctx.id} disabled (--now)")
        for key in keys:
            self.supervisor.set_disabled(key, disable)
        log.info("module %s %s%s", ctx.id, "disabled" if disable else "enabled",
                 " (--now)" if disable and now else "")
        self.queue.admit()
        return {"ok": True, "modules": self.module_list()}

    async def add_module(self, path: Path, *, keep: bool = True) -> None:
        """Load a module on the running agent (``module add``): checked and matched as at
        start, its services placed (GPU), fingerprinted and poked; kept in modules.json
        (``keep``) so that a restart loads it again. Raises ``ControlError`` with why not."""
        path = path.resolve()
        if any(ctx.manifest.bundle == path for ctx in self.modules.values()):
            raise control.ControlError("bad_request", f"module add: {path} is already loaded")
        before = set(self.modules)
        refused = self.load_modules([(path, None)], adding=True)
        if refused:
            raise control.ControlError("bad_request", "module add: " + "; ".join(
                "; ".join(m.splitlines()) for m in refused))
        (module_id,) = set(self.modules) - before
        if module_id in self.kept.removed:  # removed earlier: added again
            self.kept.removed.discard(module_id)
            self.queue.closed.pop(module_id, None)
            modulestate.write(self.state_dir, self.kept)
            for name in (module_id, self.modules[module_id].manifest.short_name):
                self.gone.pop(name, None)
        for key, rt in self.supervisor.services.items():
            if rt.ctx.id != module_id:
                continue
            if self.gpu is not None:
                self.supervisor.set_gpu_missing(
                    key, protection.gpu_api_missing(rt.svc.gpu.apis_any, self.gpu.apis))
            await self.supervisor.fingerprint(rt)  # its pools (capacity callbacks)
            self.supervisor.poke(rt)  # an `always` one starts now
        await self.check_runners([self.modules[module_id]])
        if keep and str(path) not in self.kept.added:
            self.kept.added.append(str(path))
            modulestate.write(self.state_dir, self.kept)
        log.info("module %s added from %s", module_id, path)
        self.queue.admit()

    def module_list(self) -> list[dict[str, Any]]:
        return [{"id": ctx.id, "bundle": str(ctx.manifest.bundle),
                 "state": "removing" if ctx.id in self.removing
                 else "disabled" if ctx.id in self.disabled else "enabled",
                 "services": [rt.svc.name for rt in self.supervisor.services.values()
                              if rt.ctx.id == ctx.id]}
                for ctx in self.modules.values()]

    async def _remove_module(self, ctx: ModuleCtx, now: bool, wait: bool) -> dict[str, Any]:
        """``module remove`` (moduleremove.py): kept as removed and its jobs that are not
        running failed before the answer; the rest runs on. ``wait``: answer once forgotten."""
        mid = ctx.id
        failed: list[str] = []
        if mid not in self.removing:
            self.kept.removed.add(mid)
            self.disabled.discard(mid)
            if str(ctx.manifest.bundle) in self.kept.added:
                self.kept.added.remove(str(ctx.manifest.bundle))
            modulestate.write(self.state_dir, self.kept)  # before it takes effect
            self.queue.closed[mid] = moduleremove.failure_reason(mid)
            failed = self.queue.fail_unrun(mid)
            running = sum(1 for j in self.queue.runs.tasks if self.jobs[j].module == mid)
            log.info("module %s: removing (%d queued job(s) failed, %d run(s) %s)", mid,
                     len(failed), running, "released (--now)" if now else "finish first")
            self.removing[mid] = asyncio.create_task(moduleremove.remove(self, ctx, now),
                                                     name=f"remove {mid}")
        task = self.removing[mid]
        if not wait:
            return {"ok": True, "removing": mid, "failed": failed,
                    "modules": self.module_list()}
        problems = await asyncio.shield(task)
        return {"ok": True, "removed": mid, "failed": failed, "problems": problems,
                "modules": self.module_list()}

    def _job(self, job_id: Any) -> JobRecord:
        if not isinstance(job_id, str) or job_id not in self.jobs:
            raise control.ControlError("unknown_job", f"no job {job_id!r}")
        return self.jobs[job_id]


def _with_events(rec: JobRecord, view: dict[str, Any]) -> dict[str, Any]:
    """A job's view with the events its runner emitted in its latest attempt that has some
    (--events; runnerevents.py), as kept in its history."""
    for h in reversed(rec.history):
        if "events" in h:
            view["events"] = {k: h[k] for k in h if k.startswith("events")}
            view["events"]["attempt_id"] = h.get("attempt_id")
            break
    return view


class _Removed(Exception):
    """load_modules: this module was removed here (module remove)."""

    def __init__(self, module_id: str, bundle: str) -> None:
        super().__init__(module_id)
        self.module_id, self.bundle = module_id, bundle


def _disabled_text(module_id: str) -> str:
    return (f"module {module_id} is disabled on this node: `oarbank-agent module enable "
            f"{module_id}` enables it")


def configure_logging() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")

