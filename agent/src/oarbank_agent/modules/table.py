"""The modules on this node as the running agent keeps them (contract section 1).

Loading (an invalid one refused with the checker's messages, one removed here not loaded
again, each matched against the node: compat.py), each runner's ``doctor --json``
(runnerhealth.py), a submit's module checks, and what an operator asks of a running agent:
``module list | add | disable | enable | remove`` (module_cli.py), each change kept in
``<state>/modules.json`` (state.py) before it takes effect. A removal's steps are remove.py's;
this table is what it reads and changes (``remove.Host``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oarbank_agent.host import gpuapis
from oarbank_agent.jobs import runnerhealth
from oarbank_agent.jobs.admission import Admission
from oarbank_agent.jobs.queue import JobQueue
from oarbank_agent.jobs.store import JobRecord
from oarbank_agent.modules import compat, envs
from oarbank_agent.modules import remove as moduleremove
from oarbank_agent.modules import state as modulestate
from oarbank_agent.modules.loaded import ModuleCtx, ModuleRefused, NodeInfo, load_module, module_names
from oarbank_agent.operate import control
from oarbank_agent.procs import ProcessRegistry
from oarbank_agent.protection import decisions as protection
from oarbank_agent.sandbox import policy as sandboxing
from oarbank_agent.sandbox import resourcelimits
from oarbank_agent.services.supervisor import Supervisor
from oarbank_sdk import manifest as mf
from oarbank_sdk.manifest import requirements

__all__ = ["ModuleSpec", "ModuleTable"]

log = logging.getLogger("oarbank_agent")

ModuleSpec = tuple[Path, dict[str, Any] | None]  # (module dir, settings; None: keep the file)


class ModuleTable:
    """The loaded, refused, disabled, removing and removed modules; ``modules`` is the dict the
    job queue reads. ``changed(key)``: a service's row changed (the agent's listeners)."""

    def __init__(self, *, state_dir: Path, node: NodeInfo, registry: ProcessRegistry,
                 supervisor: Supervisor, admission: Admission, queue: JobQueue,
                 modules: dict[str, ModuleCtx], changed: Callable[[str], None],
                 gpu: gpuapis.Detection | None) -> None:
        self.state_dir, self.node, self.registry = state_dir, node, registry
        self.supervisor, self.admission, self.queue = supervisor, admission, queue
        self.modules = modules
        self.jobs = queue.jobs
        self._changed = changed
        # The GPU APIs (the agent's, detected at start unless overridden): an added module's
        # services are placed against them.
        self.gpu = gpu
        self.limits_known = False  # resource limits are set up at run(): warned from then
        self.refused: dict[str, str] = {}  # a refused module's names -> why (load_modules)
        # each refused module once (its id, or its folder when the manifest is invalid) -> why:
        # `status` lists them, so nobody has to find the line the agent printed at start
        self.refused_modules: dict[str, str] = {}
        self.compat = compat.Node(node.platform)  # what manifests are matched against
        # Modules the operator disabled or added here (module disable / add), kept across
        # restarts; self.disabled is the kept set itself.
        self.kept, problem = modulestate.read(state_dir)
        self.disabled = self.kept.disabled
        if problem is not None:
            log.warning("%s", problem)
        # module remove (remove.py): removals in progress, and the names of removed
        # modules -> what a submit to one answers; their unfinished jobs fail
        self.removing: dict[str, asyncio.Task[list[str]]] = {}
        self.gone: dict[str, str] = {}
        queue.closed.update({m: moduleremove.failure_reason(m) for m in self.kept.removed})
        # module id -> what its runner's `doctor --json` said last (runnerhealth.py)
        self.runner_health = queue.runner_health
        self.envs = envs.Envs(state_dir, registry)  # module environments (envs.py)
        self._loading: list[ModuleCtx] = []  # modules whose environments are being installed
        # modules being added (module add) until their services' first fingerprints are read:
        # a submit meanwhile is refused, so one refused then has no job to leave behind
        self._adding: set[str] = set()

    async def load_added(self) -> None:
        """The modules added at run time before a restart (module add; modules.json), unless
        the command line loaded the same folder."""
        for path in self.kept.added:
            if not any(ctx.manifest.bundle == Path(path) for ctx in self.modules.values()):
                for msg in await self.load_modules([(Path(path), None)]):
                    log.warning("module added earlier (%s) refused: %s", modulestate.FILE,
                                "; ".join(msg.splitlines()))

    def service_changed(self, key: str) -> None:
        """A service's row changed (or went: module remove)."""
        self._changed(key)

    # --- loading --------------------------------------------------------------------------

    def warn_unmet_limits(self, ctx: ModuleCtx) -> None:
        for line in resourcelimits.unmet(resourcelimits.current(), ctx.manifest):
            log.warning("%s", line)

    async def load_modules(self, specs: list[ModuleSpec], *,
                           adding: bool = False) -> list[str]:
        """Load every module it can; an invalid one is refused with the checker's messages,
        one whose environment cannot be installed (envs.py) with the installer's reason.
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
            env_failure = await self.install_envs(ctx)
            if ctx.id in self.modules:  # loaded meanwhile (a concurrent `module add`)
                refused.append(f"{path}: module {ctx.id} is already loaded from "
                               f"{self.modules[ctx.id].manifest.bundle}")
                continue
            if env_failure is not None:
                line = compat.refusal_line(ctx.id, str(path), [env_failure])
                refused.append(line)
                self.refused_modules[ctx.id] = line
                for name in module_names(path):
                    self.refused[name] = line
                continue
            self.refused_modules.pop(ctx.id, None)
            self.modules[ctx.id] = ctx
            # (Windows has no euid: no root there to warn about)
            gpu_note = sandboxing.gpu_driver_note(ctx, sandboxing.current().enforce,
                                                  getattr(os, "geteuid", lambda: -1)())
            if gpu_note is not None:
                log.warning("%s: %s", ctx.id, gpu_note)
            if self.limits_known:  # (at start: once run() knows what is enforced)
                self.warn_unmet_limits(ctx)
            if ctx.manifest.runner is not None:  # its jobs run until a doctor says otherwise
                self.admission.set_capacity(runnerhealth.pool_key(ctx.id), 1)
            for rt in self.supervisor.add_module(ctx):
                if ctx.id in self.disabled:  # still disabled after a restart: never started
                    self.supervisor.set_disabled(rt.key, True, live=False)
        return refused

    def refuse_unaccountable(self, ctx: ModuleCtx) -> str | None:
        """After its services' first fingerprints: a module with a service whose ``reserve``
        the agent cannot account (an unknown unit, a negative amount: fingerprint.py) is
        refused, as an invalid manifest is (what it would cost is unknown, so admission could
        never charge it). It is unloaded before this agent starts any of its services (one
        kept across a restart is then stopped, as a service no longer loaded); returns the
        refusal's line, naming the service and the key, or None."""
        rts = [rt for rt in self.supervisor.services.values() if rt.ctx.id == ctx.id]
        problems = [f"service {rt.svc.name}: {rt.fp_reserve_problem}" for rt in rts
                    if rt.fp_reserve_problem is not None]
        if not problems:
            return None
        line = compat.refusal_line(ctx.id, str(ctx.manifest.bundle), problems)
        moduleremove.unload(self, ctx, rts)
        self.refused_modules[ctx.id] = line
        for name in (ctx.id, ctx.manifest.short_name):  # `submit` to it gives this refusal
            self.refused[name] = line
        log.warning("module refused: %s", line)
        return line

    async def install_envs(self, ctx: ModuleCtx) -> str | None:
        """Each ``requirements.txt`` its runner and services use, installed (envs.py) and set
        on ``ctx``; the reason it could not be, or None."""
        m = ctx.manifest
        execs = ([m.runner.exec] if m.runner is not None else []) + [s.exec for s in m.services]
        self._loading.append(ctx)  # its envs count as used meanwhile (sweep_envs)
        try:
            for argv in execs:
                req = requirements.requirements_for(argv, m.bundle)
                if req is None or str(req) in ctx.envs:
                    continue
                try:
                    ctx.envs[str(req)] = await self.envs.ensure(req, m.bundle.resolve(), ctx.id)
                except envs.EnvError as exc:
                    ctx.envs.clear()
                    return f"cannot install its environment ({req.name}): {exc}"
                log.info("%s: environment %s for %s", ctx.id, ctx.envs[str(req)].name, req)
        finally:
            self._loading.remove(ctx)
        return None

    def sweep_envs(self) -> None:
        """Environments no loaded module uses go once unused for the grace period."""
        used = {env.name for ctx in [*self.modules.values(), *self._loading]
                for env in ctx.envs.values()}
        for name in self.envs.sweep(used):
            log.info("environment %s removed: no loaded module used it", name)

    async def check_runners(self, ctxs: list[ModuleCtx] | None = None) -> None:
        """Each runner's ``doctor --json`` (runnerhealth.py): at load and every refresh. An
        unhealthy or undetected one's jobs are not admitted (its pseudo pool counts 0) and say
        why. Every refresh (``ctxs`` None) also sweeps the unused environments."""
        if ctxs is None:
            self.sweep_envs()
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

    # --- a job's module (submit) ---------------------------------------------------------

    def submit(self, module: str, stage: str, payload: dict[str, Any],
               portal: dict[str, Any] | None = None) -> JobRecord:
        ctx = self.find_module(module)
        if ctx is None and module in self.gone:
            raise control.ControlError("unknown_module", self.gone[module])
        if ctx is not None and ctx.id in self.removing:
            raise control.ControlError("module_removed", moduleremove.removing_text(ctx.id))
        if ctx is not None and ctx.id in self._adding:
            raise control.ControlError("module_loading", f"module {ctx.id} is being added "
                                       "(oarbank-agent module add): submit once it answers")
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
        return self.queue.submit(ctx, st, payload, portal)

    # --- what an operator asks (module list | add | disable | enable | remove) -----------

    async def request(self, req: dict[str, Any]) -> dict[str, Any]:
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
        refused = await self.load_modules([(path, None)], adding=True)
        if refused:
            raise control.ControlError("bad_request", "module add: " + "; ".join(
                "; ".join(m.splitlines()) for m in refused))
        # (by its folder: another add may have loaded a module while this one's env was built)
        ctx = next(c for c in self.modules.values() if c.manifest.bundle == path)
        module_id = ctx.id
        rts = [(key, rt) for key, rt in self.supervisor.services.items()
               if rt.ctx.id == module_id]
        self._adding.add(module_id)
        try:
            for key, rt in rts:  # (it awaits: adds go on)
                if self.gpu is not None:
                    self.supervisor.set_gpu_missing(
                        key, protection.gpu_api_missing(rt.svc.gpu.apis_any, self.gpu.apis))
                await self.supervisor.fingerprint(rt)  # its pools (capacity callbacks)
        finally:
            self._adding.discard(module_id)
        refusal = self.refuse_unaccountable(ctx)
        if refusal is not None:
            raise control.ControlError("bad_request", f"module add: {refusal}")
        if module_id in self.kept.removed:  # removed earlier: added again
            self.kept.removed.discard(module_id)
            self.queue.closed.pop(module_id, None)
            modulestate.write(self.state_dir, self.kept)
            for name in (module_id, ctx.manifest.short_name):
                self.gone.pop(name, None)
        for _, rt in rts:
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
                              if rt.ctx.id == ctx.id],
                 "envs": ctx.env_report()}
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


class _Removed(Exception):
    """load_modules: this module was removed here (module remove)."""

    def __init__(self, module_id: str, bundle: str) -> None:
        super().__init__(module_id)
        self.module_id, self.bundle = module_id, bundle


def _disabled_text(module_id: str) -> str:
    return (f"module {module_id} is disabled on this node: `oarbank-agent module enable "
            f"{module_id}` enables it")
