"""The agent: wiring of modules, supervisor, broker, admission, jobs and the control socket.

One asyncio loop. This module builds the parts from one ``AgentConfig``, connects their
callbacks, starts them in order and stops them in order; each does its own work elsewhere:

- a job's states and their table: ``jobs/machine.py``; from submit to its run (records,
  queue, admission, users): ``jobs/queue.py``; its run (attempts, retries, finishing,
  releasing): ``jobs/run.py``; where it stands against the node's services:
  ``jobs/placement.py``;
- the modules (loading, refusals, runners' doctors, ``module add | disable | enable |
  remove``): ``modules/table.py``;
- the answers on the control socket: ``operate/answers.py``;
- what host protection reports, applied: ``protection/apply.py``;
- the heartbeat report and ``status``: ``reporting/status.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oarbank_agent import faults, platform, procs, recovery
from oarbank_agent.broker.channel import Channels
from oarbank_agent.broker.handover import Broker
from oarbank_agent.host import gpuapis, gpumem
from oarbank_agent.jobs.admission import Admission
from oarbank_agent.jobs.queue import JobQueue
from oarbank_agent.jobs.store import JobRecord, JobStore
from oarbank_agent.keep.adopt import Keeping
from oarbank_agent.modules.loaded import ModuleCtx, NodeInfo
from oarbank_agent.modules.table import ModuleSpec, ModuleTable
from oarbank_agent.operate import answers, control, drain, reload
from oarbank_agent.platform.api import Tether
from oarbank_agent.protection import apply
from oarbank_agent.protection import decisions as protection
from oarbank_agent.protection.evictor import Evictor
from oarbank_agent.protection.guard import Action, Guard, GuardConfig
from oarbank_agent.reporting import status as nodestatus
from oarbank_agent.sandbox import containment, escapewatch, resourcelimits
from oarbank_agent.services import detachedwatch, manualwatch, ownedwatch, runningwatch
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services.supervisor import Supervisor

__all__ = ["Agent", "AgentConfig", "ModuleSpec"]

log = logging.getLogger("oarbank_agent")


@dataclass
class AgentConfig:
    """Everything ``oarbank-agent run`` decides before the agent exists (run_cli.cmd_run)."""

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
    # A released job whose runner accepts a stop gets this long to stop at a safe point
    # before its attempt is ended (jobs/run.py; --release-grace-s).
    release_grace_s: float = 10.0
    # Final job records (and their workdirs) are removed this long after they finished
    # (--keep-jobs-s): the state dir of a busy node stays bounded.
    keep_jobs_s: float = 7 * 86400.0
    # A module environment no loaded module uses is removed this long after (--env-grace-s).
    env_grace_s: float = 3600.0
    # Running services are fingerprinted again this often, and once right after each becomes
    # ready (runningwatch; --refresh-s).
    refresh_s: float = runningwatch.DEFAULT_INTERVAL_S
    # Endpoint services outlive the agent, their channels held by a keeper (keep/;
    # --keep-services); off: the contract's rule, each is stopped at a restart.
    keep_services: bool = False


class Agent:
    """The node's parts, built from one ``AgentConfig`` and wired together; ``run`` starts
    them in order and, once a stop is asked and the drain is over, ``shutdown`` ends them."""

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
        self.keeping = Keeping(self.state_dir, self.supervisor, self.registry,
                               enabled=config.keep_services)
        self.admission = Admission()
        self.gpu_memory = gpumem.Reader()  # NVML, where there is one (heartbeats, admission)
        self.modules: dict[str, ModuleCtx] = {}  # the module table's; the job queue reads it
        self._stop = asyncio.Event()
        self.queue = JobQueue(store=self.store, supervisor=self.supervisor,
                              admission=self.admission, broker=self.broker,
                              registry=self.registry, node=self.node, modules=self.modules,
                              stopping=self._stop,
                              charge_released=config.fault == faults.CHARGE_RELEASED,
                              release_grace_s=config.release_grace_s)
        self.jobs: dict[str, JobRecord] = self.queue.jobs  # every job this agent knows
        # Demand eviction: idle services stopped to make room for a job memory holds back.
        self.evictor = Evictor(self.supervisor, self.admission, self.queue.admit,
                               lambda job_id: self.jobs[job_id].module)
        if config.fault != faults.NO_DEMAND_EVICTION:  # test-only fault: never evict
            self.queue.after_admit.append(self.evictor.after_pass)
        # The modules (modules/table.py): loading, refusals, runners' doctors, module list |
        # add | disable | enable | remove; the agent reads its parts through these names.
        self.table = ModuleTable(state_dir=self.state_dir, node=self.node,
                                 registry=self.registry, supervisor=self.supervisor,
                                 admission=self.admission, queue=self.queue,
                                 modules=self.modules, changed=self._service_changed,
                                 gpu=config.gpu)
        self.table.envs.grace_s = config.env_grace_s
        self.refused, self.refused_modules = self.table.refused, self.table.refused_modules
        self.compat, self.kept = self.table.compat, self.table.kept
        self.disabled, self.removing, self.gone = (self.table.disabled, self.table.removing,
                                                   self.table.gone)
        self.runner_health = self.table.runner_health
        self.on_change: list[Callable[[str], None]] = []  # heartbeat hook: service key changed
        self.heartbeat: Any = None  # the HeartbeatSender when there is a portal (its status)
        self.fleet: Any = None  # fleet.FleetDispatch with --claim (its status)
        self.on_stop: list[Callable[[], None]] = []  # a stop was asked: the drain begins
        self.supervisor.on_change.append(self._service_changed)
        self.supervisor.on_capacity.append(self._capacity_changed)
        self.control = control.ControlServer(self.state_dir / control.SOCKET_NAME, self._answer)
        # Host protection (guard.py) samples and reports; the agent applies (``protect``).
        # The GPU APIs are detected at start unless overridden.
        self.guard = Guard(config.guard, self.supervisor,
                           running_jobs=self.queue.running_job_groups, report=self.protect)
        self.manual_refresh_s = config.manual_refresh_s
        self._manual_task: asyncio.Task[None] | None = None
        self._escape_task: asyncio.Task[None] | None = None  # escapewatch
        self._prune_task: asyncio.Task[None] | None = None  # JobQueue.prune_every
        self.refresher = runningwatch.Refresher(self.supervisor, config.refresh_s,
                                                also=self.check_runners)
        # list_owned / destroy --force for objects of attempts that are over (G6)
        self.reaper = ownedwatch.Reaper(self.supervisor, self.broker.wire_attempts)
        self.broker.on_attempt_end = self.reaper.poke
        self.fault: str | None = config.fault
        self.stop_reason: str | None = None  # a stop request (its name), a drain (logged)
        # Re-reads the config and settings files (cli.py); None: `reload` has nothing to read.
        self.reload_source: Callable[[], reload.Reloaded] | None = None
        self._reloading: asyncio.Task[Any] | None = None
        self._hurry = asyncio.Event()  # a second stop request: the drain waits no longer
        self._tether: Tether | None = None  # runners die with this agent (platform's tether)

    # --- the parts' answers, as the rest of the agent asks for them -------------------------

    async def load_modules(self, specs: list[ModuleSpec], *,
                           adding: bool = False) -> list[str]:
        return await self.table.load_modules(specs, adding=adding)

    async def check_runners(self, ctxs: list[ModuleCtx] | None = None) -> None:
        await self.table.check_runners(ctxs)

    def find_module(self, name: str) -> ModuleCtx | None:
        return self.table.find_module(name)

    def submit(self, module: str, stage: str, payload: dict[str, Any],
               portal: dict[str, Any] | None = None) -> JobRecord:
        """A job of ``module``'s ``stage``: local (``submit``), or granted by the portal
        (``portal``: its grant, fleet dispatch)."""
        return self.table.submit(module, stage, payload, portal)

    @property
    def gpu(self) -> gpuapis.Detection | None:
        return self.table.gpu

    @gpu.setter
    def gpu(self, value: gpuapis.Detection | None) -> None:
        self.table.gpu = value

    def report(self) -> dict[str, Any]:
        return nodestatus.report(self)

    def status(self, jobs_limit: int | None = None, jobs_page: int = 1) -> dict[str, Any]:
        return nodestatus.status(self, jobs_limit, jobs_page)

    def job_view(self, rec: JobRecord, view: dict[str, Any]) -> dict[str, Any]:
        return nodestatus.with_wait(self, rec, view)

    def protect(self, actions: list[Action]) -> None:
        """Apply what host protection reports (protection/apply.py)."""
        apply.apply(actions, self.admission, self.queue, self.supervisor)

    def stopping(self) -> bool:
        return self._stop.is_set()

    async def _answer(self, req: dict[str, Any]) -> dict[str, Any]:
        return await answers.answer(self, req)

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
        # Control nudges (jobs/controlio.py): every child starts with them ignored, so one
        # that comes before a runner installed its handler is lost harmlessly.
        nudges = platform.current().nudges
        if nudges is not None:
            nudges.prepare()
        # Fate sharing, before any runner can start: from now on every runner (and all it
        # started) is killed the moment this agent ends, however it ends (platform/posix/
        # tether.py; on Windows the job objects do it), so no work goes on unseen.
        self._tether = self._start_tether()
        # Test-only faults: the lifecycle's inputs (decisions), and one effect (error text).
        self.supervisor.set_faults(idle_stop=self.fault != faults.NO_IDLE_STOP,
                                   flat_backoff=self.fault == faults.FLAT_BACKOFF)
        self.supervisor.bare_start_errors = self.fault == faults.BARE_START_ERRORS
        if self.fault is not None:
            log.warning("!!! %s !!!", faults.describe(self.fault))
        box = containment.current()  # one line: which resource limits are enforced here
        base, why = (box.base if box.enabled else None), box.note
        if self.keeping.enabled and self.keeping.manager is not None:
            # Kept services stay in the unit, where systemd puts the next agent; limits given
            # out below the unit would make that start fail (agent/systemd/keep-services.conf
            # says why; seen on the VM backend), so none are.
            base, why = None, ("--keep-services under systemd: no limits below the unit, so "
                               "that systemd can start the next agent in it")
        resourcelimits.install(resourcelimits.setup(base, why))
        self.table.limits_known = True
        for ctx in self.modules.values():
            self.table.warn_unmet_limits(ctx)
        spare = self.keeping.take()  # channels a keeper held across the restart (keep/)
        if self.fault == faults.KEEP_PREDECESSOR_GROUPS:
            kept: dict[str, procs.GroupRecord] = {}  # fault injection: nothing is ended
        else:
            # A previous agent's groups: ended, except services that may be adopted (recovery.py)
            kept = await recovery.end_leftovers(self.registry, self.supervisor, spare=spare)
        await self.table.load_added()  # modules added before a restart (module add)
        self.gpu = await apply.place_gpu_services(self.supervisor, self.gpu)
        self.admission.budget_gb = apply.memory_budget_gb(self.guard.config)
        self.admission.gpu_budget_gb = await asyncio.to_thread(apply.gpu_budget_gb,
                                                               self.gpu_memory)
        await asyncio.gather(self.check_runners(),
                             *(self.supervisor.fingerprint(rt)
                               for rt in self.supervisor.services.values()))
        for ctx in list(self.modules.values()):  # a reserve it cannot account: refused
            self.table.refuse_unaccountable(ctx)
        readopted = await self.keeping.readopt()  # the kept ones proven the same
        await recovery.adopt_running(self.registry, self.supervisor, kept, readopted=readopted)
        self.queue.recover()
        await self.control.start()
        # The host rules an operator set before a restart hold again (hostrules.py).
        apply.restore_rules(self.guard, self.state_dir, self.protect)
        self.protect(self.guard.sample())  # the first sample before anything starts
        self.guard.start()
        self._manual_task = manualwatch.start(self.supervisor, self.manual_refresh_s)
        self._escape_task = escapewatch.start(self.registry)  # sandboxed groups stay confined
        self._prune_task = asyncio.create_task(self.queue.prune_every(self.config.keep_jobs_s),
                                               name="prune jobs")
        self.refresher.start()  # health and pools of running services follow them
        self.reaper.start()
        for rt in self.supervisor.services.values():
            self.supervisor.poke(rt)  # `always` services start now
        self.queue.admit()
        if ready:
            ready()
        self._tell_manager({"READY": "1", "STATUS": "serving"})  # the control socket answers
        try:
            # --keep-services: from now on a keeper holds every ready endpoint service's
            # channel (started once the agent serves: its interpreter's start delays nothing).
            await self.keeping.start()
            await self._stop.wait()
            await drain.wait_running(self.queue.runs, self.jobs, self.config.drain_s,
                                     self.stop_reason or "stop", self._hurry)
        finally:
            await self.shutdown()

    def _start_tether(self) -> Tether | None:
        host = platform.current().tether
        if host is None:
            return None
        try:
            tether = host.start(self.state_dir)
        except OSError as exc:
            log.warning("runners will outlive this agent if it is killed: its watcher did not "
                        "start (%s); the next agent ends them", exc)
            return None
        log.info("runners die with this agent: watcher pid %d", tether.pid)
        return tether

    async def _stop_tether(self) -> None:
        """Every runner is ended: the watcher goes (it sees EOF), reaped here."""
        tether, self._tether = self._tether, None
        if tether is None:
            return
        tether.close()
        for _ in range(500):
            if tether.exited():
                return
            await asyncio.sleep(0.01)
        tether.kill()

    @staticmethod
    def _tell_manager(fields: dict[str, str]) -> None:
        """systemd (``Type=notify``), where it runs the agent: READY once the control socket
        answers, STOPPING when the drain begins."""
        sm = platform.current().service_manager
        if sm is None or not sm.active():
            return
        try:
            sm.notify(fields)
        except OSError as exc:
            log.warning("could not tell the service manager %s: %s", ",".join(fields), exc)

    def request_stop(self, why: str = "stop") -> None:
        """Begin the drain (drain.py): nothing more is admitted from now on. Asked again
        while draining: the drain ends now (what still runs is released)."""
        if not self._stop.is_set():
            self._tell_manager({"STOPPING": "1", "STATUS": f"draining ({why})"})
            self.stop_reason = why
            log.info("stop requested (%s): draining", why)
            for cb in list(self.on_stop):
                cb()
        elif not self._hurry.is_set():
            self._hurry.set()
        self._stop.set()

    async def reload(self) -> list[str]:
        """Re-read config and settings, apply timings, fingerprint again (reload.py)."""
        if self.reload_source is None:
            raise control.ControlError("bad_request", "this agent has no config to reload")
        try:
            return await reload.reload(self.supervisor, self.modules, self.find_module,
                                       self.reload_source)
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
        self.evictor.close()
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
        self.keeping.let_go()  # --keep-services: what the keeper holds goes on running
        log.info("stopping %d service(s)", sum(1 for rt in self.supervisor.services.values()
                                                 if rt.st.state is not lc.State.STOPPED))
        await self.supervisor.shutdown()
        self.keeping.close()
        await self.broker.aclose()
        containment.current().close()  # every group is ended: what held them is empty
        forgotten = self.registry.forget_gone()
        if forgotten:
            log.warning("stop: forgot the records of %d group(s) already gone that no task "
                        "retired: %s", len(forgotten), ", ".join(forgotten))
        await self._stop_tether()
        log.info("stopped: every service and job process ended; exiting")

    # --- control requests -----------------------------------------------------------------
