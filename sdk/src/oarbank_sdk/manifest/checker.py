"""Check a parsed ``oarbank-module.toml`` and build the ``Manifest`` (contract section 1).

Pure: takes the parsed document, returns ``(Manifest | None, problems)``; no file access.
Rules:
- The sections this project acts on are checked strictly: every key must be in the section's
  list (else "unknown key") and have the right type.
- The platform's other top-level sections (``[coordinator]``, ``[results]``, ``[goldens]``,
  ``[[operations]]``, ``[[probes]]``, ``[datasets]``, ``[cli]``, ...) are accepted unread, and
  upstream's keys this project does not act on (``upstream.py``) are checked by upstream's
  rules: each gets one ``Note`` (on ``Manifest.notes``), never a problem.
- Keys the contract lists without saying what they hold (``module.compat``,
  ``stages[].checkpoint``, ...) are accepted with any value: the wider platform defines them.
- Checking never stops at the first problem; a Manifest is returned only when there are none.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..gpu import GPU_APIS
from ..versions import RangeError, at_least, parse_range
from . import upstream
from .model import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    IDLE_TIMEOUT_S,
    LIFECYCLES,
    MAX_ATTEMPTS,
    MAX_FAILURES,
    STAGE_TIMEOUT_S,
    START_TIMEOUT_S,
    STOP_GRACE_S,
    STOP_TIMEOUT_S,
    Gpu,
    Manifest,
    Problem,
    Restart,
    Runner,
    Service,
    Stage,
    UiEntry,
)
from .reader import MISSING, Reader, join

__all__ = ["build", "PLATFORMS", "GPU_APIS"]

PLATFORMS = (
    "linux-amd64",
    "linux-arm64",
    "darwin-arm64",
    "darwin-amd64",
    "windows-amd64",
    "windows-arm64",
)
GPU_USES = ("none", "shared", "exclusive")

MODULE_ID = re.compile(r"^[a-z][a-z0-9-]*(\.[a-z0-9][a-z0-9_-]*)+$")
SERVICE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# endpoint and gpu on a service appeared in core 2.5; older cores would reject them.
ENDPOINT_MIN_CORE = (2, 5)

ACTED_ON = ("manifest", "module", "requires", "runner", "stages", "services", "sandbox", "ui")

MODULE_KEYS = ("id", "version", "compat", "publisher", "license", "codeowners", "stability",
               "description")
REQUIRES_KEYS = ("core", "agent", "os", "platforms", "module_protocol", "runner_protocol",
                 "service_protocol", "experimental", "ui_contract", "coordinator_platforms",
                 "unsupported", "features")
RUNNER_KEYS = ("exec", "runtime", "capabilities", "stop_grace_s", "gpu", "env", "variants",
               "bandwidth_class", "checkpoint_grace_s")
STAGE_KEYS = ("name", "after", "determinism", "default", "bootstrap", "requires", "timeout_s",
              "retry", "variants", "secrets", "checkpoint", "placement")
STAGE_REQUIRES_KEYS = ("capabilities", "pools", "needs_pools", "platforms", "resources")
RESOURCES_KEYS = ("cpu", "mem_gb")
RETRY_KEYS = ("max_attempts",)
SERVICE_KEYS = ("name", "exec", "lifecycle", "idle_timeout_s", "start_timeout_s",
                "stop_timeout_s", "restart", "endpoint", "provides", "reserves_host_memory",
                "yieldable", "gpu", "platforms", "freeze_ok")
RESTART_KEYS = ("backoff_initial_s", "backoff_max_s", "max_failures")
PROVIDES_KEYS = ("pools", "capabilities")
GPU_KEYS = ("use", "apis_any")
DEVICES_KEYS = ("gpu",)
UI_KEYS = ("pages", "panels")
UI_ENTRY_KEYS = ("id", "title", "slot", "file", "when")


def build(doc: dict[str, Any], path: Path, bundle: Path) -> tuple[Manifest | None, list[Problem]]:
    r = Reader()
    _check_top_level(r, doc)

    module = r.table(doc.get("module", MISSING), "module", default={}) or {}
    if "module" not in doc:
        r.add("module", "required section [module] is missing")
    r.known_keys(module, "module", MODULE_KEYS, "[module]")
    mod_id = r.string(r.get(module, "id", "module", required="module" in doc), "module.id", "")
    if mod_id and not MODULE_ID.match(mod_id):
        r.add("module.id", f'"{mod_id}" is not a reverse-DNS id like "dev.example.modelserver" '
              "(lower case, at least two dot-separated parts)")
    version = r.string(r.get(module, "version", "module", required="module" in doc),
                       "module.version", "", nonempty=True)
    description = r.string(r.get(module, "description", "module", ""), "module.description", "")
    for key in ("publisher", "license", "stability"):
        r.string(module.get(key, MISSING), join("module", key))
    r.string_list(module.get("codeowners", MISSING), "module.codeowners")

    requires = _requires(r, doc)
    runner = _runner(r, doc)
    sandbox = r.table(doc.get("sandbox", MISSING), "sandbox", default={}) or {}
    gpu_compute = _sandbox(r, sandbox)
    services = _services(r, doc)
    stages = _stages(r, doc)
    pages, panels = _ui(r, doc)

    _cross_checks(r, doc, requires, services, stages, gpu_compute, bool(pages or panels))

    if r.problems:
        return None, r.problems
    manifest = Manifest(
        path=path,
        bundle=bundle,
        id=mod_id,
        version=version,
        description=description,
        runner=runner,
        stages=tuple(s for s, _ in stages),
        services=tuple(s for s, _, _ in services),
        pages=pages,
        panels=panels,
        sandbox=sandbox,
        raw=doc,
        notes=tuple(r.notes),
    )
    return manifest, []


# -- sections -------------------------------------------------------------------------------


def _check_top_level(r: Reader, doc: dict[str, Any]) -> None:
    value = doc.get("manifest", MISSING)
    if value is MISSING:
        r.add("manifest", "required key is missing: write manifest = 1 at the top of the file")
    elif isinstance(value, bool) or not isinstance(value, int):
        r.add("manifest", f"expected the integer 1, got {_d(value)}")
    elif value != 1:
        r.add("manifest", f"unsupported manifest format {value}; this SDK reads manifest = 1")
    for key, value in doc.items():
        if key in ACTED_ON:
            continue
        # The platform's other sections are passed over; a stray top-level value is not a section.
        if isinstance(value, dict) or (
            isinstance(value, list) and all(isinstance(v, dict) for v in value)
        ):
            upstream.note_section(r, key, value)
            continue
        r.add(join("", key), "unknown key; the only top-level value is manifest, "
              "everything else goes in a [section]")


def _requires(r: Reader, doc: dict[str, Any]) -> dict[str, Any]:
    req = r.table(doc.get("requires", MISSING), "requires", default={}) or {}
    r.known_keys(req, "requires", REQUIRES_KEYS, "[requires]")
    out: dict[str, Any] = {}
    for key in ("core", "agent", "ui_contract"):
        value = r.string(req.get(key, MISSING), join("requires", key))
        if value is not None:
            try:
                parse_range(value)
                out[key] = value
            except RangeError as e:
                r.add(join("requires", key), str(e))
    _platforms(r, req.get("platforms", MISSING), "requires.platforms")
    r.string_list(req.get("coordinator_platforms", MISSING), "requires.coordinator_platforms")
    for key in ("module_protocol", "runner_protocol", "service_protocol"):
        p = join("requires", key)
        versions = r.int_list(req.get(key, MISSING), p, default=None)
        if versions is not None:
            for i, v in enumerate(versions):
                if v <= 0:
                    r.add(join(p, i), f"protocol versions are positive integers, got {v}")
        out[key] = versions
    return out


def _platforms(r: Reader, value: Any, path: str) -> tuple[str, ...]:
    tokens = r.string_list(value, path)
    for i, token in enumerate(tokens):
        if token not in PLATFORMS:
            r.add(join(path, i), f'unknown platform "{token}"; expected <os>-<arch>, one of '
                  + ", ".join(PLATFORMS))
    return tokens


def _exec(r: Reader, value: Any, path: str) -> tuple[str, ...]:
    argv = r.string_list(value, path, default=(), nonempty=True)
    if argv:
        first = argv[0]
        if first != "python" and not (first.startswith("{bundle}/") and len(first) > 9):
            r.add(join(path, 0), f'"{first}" must be the token "python" (the interpreter that '
                  'runs modules) or a path inside the bundle written "{bundle}/<path>"')
        for i, arg in enumerate(argv):
            # What runs must be the module's own code: the agent's sandbox lets a child read
            # its bundle, not its neighbours (contract section 9).
            if any(".." in rest.split(None, 1)[0].split("/") for rest in
                   arg.split("{bundle}")[1:] if rest.strip()):
                r.add(join(path, i), f'"{arg}" leaves the bundle: a path after {{bundle}} must '
                      'stay inside it (no ".." component); copy shared code into the bundle')
    return argv


def _runner(r: Reader, doc: dict[str, Any]) -> Runner | None:
    if "runner" not in doc:
        return None
    t = r.table(doc["runner"], "runner")
    if t is None:
        return None
    r.known_keys(t, "runner", RUNNER_KEYS, "[runner]")
    argv = _exec(r, r.get(t, "exec", "runner", required=True), "runner.exec")
    env: dict[str, str] = {}
    env_t = r.table(t.get("env", MISSING), "runner.env", default={}) or {}
    for k, v in env_t.items():
        if r.string(v, join("runner.env", k)) is not None:
            env[k] = v
    grace = r.positive_number(t.get("stop_grace_s", MISSING), "runner.stop_grace_s",
                              STOP_GRACE_S)
    r.string_list(t.get("capabilities", MISSING), "runner.capabilities")
    upstream.runner_extras(r, t, grace)
    return Runner(exec=argv, env=env, stop_grace_s=grace)


def _sandbox(r: Reader, sandbox: dict[str, Any]) -> bool:
    """[sandbox] is open ("..." in the contract); only devices is read. True if gpu = compute."""
    devices = r.table(sandbox.get("devices", MISSING), "sandbox.devices", default={}) or {}
    r.known_keys(devices, "sandbox.devices", DEVICES_KEYS, "[sandbox.devices]")
    gpu = r.string(devices.get("gpu", MISSING), "sandbox.devices.gpu")
    upstream.note_sandbox(r, sandbox)
    return gpu == "compute"


def _array_of_tables(
    r: Reader, table: dict[str, Any], key: str, prefix: str = ""
) -> list[tuple[str, dict]]:
    path = join(prefix, key)
    value = table.get(key, MISSING)
    if value is MISSING:
        return []
    if not isinstance(value, list):
        shown = f"[[{path}]]" if not prefix else "a list of tables"
        r.add(path, f"expected an array of tables ({shown}), got {_d(value)}")
        return []
    out = []
    for i, item in enumerate(value):
        if r.table(item, join(path, i)) is not None:
            out.append((join(path, i), item))
    return out


def _services(r: Reader, doc: dict[str, Any]) -> list[tuple[Service, str, dict[str, Any]]]:
    """Each Service with its key path and raw table (for the cross checks)."""
    out = []
    for p, t in _array_of_tables(r, doc, "services"):
        r.known_keys(t, p, SERVICE_KEYS, "[[services]]")
        name = r.string(r.get(t, "name", p, required=True), join(p, "name"), "")
        if name and not SERVICE_NAME.match(name):
            r.add(join(p, "name"), f'"{name}" must match ^[a-z][a-z0-9_]*$ (lower case letters, '
                  "digits and _, starting with a letter): it becomes OARBANK_SERVICE_<NAME>")
        argv = _exec(r, r.get(t, "exec", p, required=True), join(p, "exec"))
        lifecycle = r.one_of(t.get("lifecycle", MISSING), join(p, "lifecycle"), LIFECYCLES,
                             "on_demand")
        timeouts = {
            k: r.positive_number(t.get(k, MISSING), join(p, k), default)
            for k, default in (("idle_timeout_s", IDLE_TIMEOUT_S),
                               ("start_timeout_s", START_TIMEOUT_S),
                               ("stop_timeout_s", STOP_TIMEOUT_S))
        }
        restart = Restart()
        rt = r.table(t.get("restart", MISSING), join(p, "restart"))
        if rt is not None:
            rp = join(p, "restart")
            r.known_keys(rt, rp, RESTART_KEYS, "restart")
            restart = Restart(
                backoff_initial_s=r.positive_number(rt.get("backoff_initial_s", MISSING),
                                                    join(rp, "backoff_initial_s"),
                                                    BACKOFF_INITIAL_S),
                backoff_max_s=r.positive_number(rt.get("backoff_max_s", MISSING),
                                                join(rp, "backoff_max_s"), BACKOFF_MAX_S),
                max_failures=r.positive_int(rt.get("max_failures", MISSING),
                                            join(rp, "max_failures"), MAX_FAILURES),
            )
            if restart.backoff_max_s < restart.backoff_initial_s:
                r.add(join(rp, "backoff_max_s"), f"{restart.backoff_max_s:g} is less than "
                      f"backoff_initial_s ({restart.backoff_initial_s:g})")
        endpoint = r.boolean(t.get("endpoint", MISSING), join(p, "endpoint"), False)
        pools: tuple[str, ...] = ()
        caps: tuple[str, ...] = ()
        pt = r.table(t.get("provides", MISSING), join(p, "provides"))
        if pt is not None:
            pp = join(p, "provides")
            r.known_keys(pt, pp, PROVIDES_KEYS, "provides")
            pools = r.string_list(pt.get("pools", MISSING), join(pp, "pools"))
            caps = r.string_list(pt.get("capabilities", MISSING), join(pp, "capabilities"))
            for i, pool in enumerate(pools):
                if not pool.strip():
                    r.add(join(join(pp, "pools"), i), "a pool name must not be empty")
        gpu = Gpu()
        gt = r.table(t.get("gpu", MISSING), join(p, "gpu"))
        if gt is not None:
            gp = join(p, "gpu")
            r.known_keys(gt, gp, GPU_KEYS, "gpu")
            use = r.one_of(gt.get("use", MISSING), join(gp, "use"), GPU_USES, "none")
            apis = r.string_list(gt.get("apis_any", MISSING), join(gp, "apis_any"))
            for i, api in enumerate(apis):
                if api not in GPU_APIS:
                    r.add(join(join(gp, "apis_any"), i), f'unknown GPU API "{api}"; expected one '
                          "of " + ", ".join(GPU_APIS))
            gpu = Gpu(use=use, apis_any=apis)
        service = Service(
            name=name,
            exec=argv,
            lifecycle=lifecycle,
            restart=restart,
            endpoint=endpoint,
            pools=pools,
            capabilities=caps,
            reserves_host_memory=r.boolean(t.get("reserves_host_memory", MISSING),
                                           join(p, "reserves_host_memory"), False),
            yieldable=r.boolean(t.get("yieldable", MISSING), join(p, "yieldable"), True),
            gpu=gpu,
            platforms=_platforms(r, t.get("platforms", MISSING), join(p, "platforms")),
            freeze_ok=r.boolean(t.get("freeze_ok", MISSING), join(p, "freeze_ok")),
            **timeouts,
        )
        out.append((service, p, t))
    return out


def _stages(r: Reader, doc: dict[str, Any]) -> list[tuple[Stage, str]]:
    out = []
    for p, t in _array_of_tables(r, doc, "stages"):
        r.known_keys(t, p, STAGE_KEYS, "[[stages]]")
        name = r.string(r.get(t, "name", p, required=True), join(p, "name"), "", nonempty=True)
        upstream.note_stage(r, t, p)
        timeout = r.positive_number(t.get("timeout_s", MISSING), join(p, "timeout_s"),
                                    STAGE_TIMEOUT_S)
        max_attempts = MAX_ATTEMPTS
        rt = r.table(t.get("retry", MISSING), join(p, "retry"))
        if rt is not None:
            r.known_keys(rt, join(p, "retry"), RETRY_KEYS, "retry")
            max_attempts = r.positive_int(rt.get("max_attempts", MISSING),
                                          join(p, "retry.max_attempts"), MAX_ATTEMPTS)
        after = t.get("after", MISSING)
        if not isinstance(after, str):  # one stage name or a list of them
            r.string_list(after, join(p, "after"))
        pools: dict[str, int] = {}
        needs: tuple[str, ...] = ()
        caps: tuple[str, ...] = ()
        platforms: tuple[str, ...] = ()
        cpu = mem = None
        req = r.table(t.get("requires", MISSING), join(p, "requires"))
        if req is not None:
            rp = join(p, "requires")
            r.known_keys(req, rp, STAGE_REQUIRES_KEYS, "a stage's requires")
            pt = r.table(req.get("pools", MISSING), join(rp, "pools"), default={}) or {}
            for pool, n in pt.items():
                count = r.positive_int(n, join(join(rp, "pools"), pool))
                if count is not None:
                    pools[pool] = count
            needs = r.string_list(req.get("needs_pools", MISSING), join(rp, "needs_pools"))
            caps = r.string_list(req.get("capabilities", MISSING), join(rp, "capabilities"))
            platforms = _platforms(r, req.get("platforms", MISSING), join(rp, "platforms"))
            res = r.table(req.get("resources", MISSING), join(rp, "resources"))
            if res is not None:
                resp = join(rp, "resources")
                r.known_keys(res, resp, RESOURCES_KEYS, "resources")
                cpu = r.positive_number(res.get("cpu", MISSING), join(resp, "cpu"))
                mem = r.positive_number(res.get("mem_gb", MISSING), join(resp, "mem_gb"))
        stage = Stage(name=name, timeout_s=timeout, pools=pools, needs_pools=needs, cpu=cpu,
                      mem_gb=mem, max_attempts=max_attempts, capabilities=caps,
                      platforms=platforms)
        out.append((stage, p))
    return out


def _ui(r: Reader, doc: dict[str, Any]) -> tuple[tuple[UiEntry, ...], tuple[UiEntry, ...]]:
    ui = r.table(doc.get("ui", MISSING), "ui", default={}) or {}
    r.known_keys(ui, "ui", UI_KEYS + upstream.UI_UPSTREAM_KEYS, "[ui]")
    upstream.ui_extras(r, ui)
    result = []
    for kind in UI_KEYS:
        entries = []
        seen: dict[str, str] = {}
        for p, t in _array_of_tables(r, ui, kind, prefix="ui"):
            r.known_keys(t, p, UI_ENTRY_KEYS, f"a [ui] {kind} entry")
            eid = r.string(r.get(t, "id", p, required=True), join(p, "id"), "", nonempty=True)
            file = r.string(r.get(t, "file", p, required=True), join(p, "file"), "",
                            nonempty=True)
            title = r.string(t.get("title", MISSING), join(p, "title"), eid)
            slot = r.string(t.get("slot", MISSING), join(p, "slot"), "")
            if "when" in t:
                upstream.note_when(r, t["when"], join(p, "when"))
            if eid and eid in seen:
                r.add(join(p, "id"), f'duplicate id "{eid}" (also {seen[eid]})')
            seen.setdefault(eid, join(p, "id"))
            if file and (Path(file).is_absolute() or ".." in Path(file).parts
                         or file.startswith("{bundle}")):
                r.add(join(p, "file"), f'"{file}" must be a path relative to the bundle, '
                      "inside it (e.g. ui/pages/overview.json)")
            entries.append(UiEntry(id=eid, title=title, slot=slot, file=file))
        result.append(tuple(entries))
    return result[0], result[1]


# -- rules across sections ------------------------------------------------------------------


def _cross_checks(
    r: Reader,
    doc: dict[str, Any],
    requires: dict[str, Any],
    services: list[tuple[Service, str, dict[str, Any]]],
    stages: list[tuple[Stage, str]],
    gpu_compute: bool,
    has_ui: bool,
) -> None:
    seen: dict[str, str] = {}
    provided: dict[str, str] = {}
    core = requires.get("core")
    core_ok = core is not None and at_least(core, ENDPOINT_MIN_CORE)
    for svc, p, raw in services:
        if svc.name:
            if svc.name in seen:
                r.add(join(p, "name"), f'duplicate service name "{svc.name}" (also {seen[svc.name]})')
            seen.setdefault(svc.name, join(p, "name"))
        for i, pool in enumerate(svc.pools):
            if pool in provided:
                r.add(join(join(p, "provides.pools"), i),
                      f'pool "{pool}" is already provided by {provided[pool]}: a pool belongs '
                      "to one service")
            provided.setdefault(pool, p)
        if svc.endpoint and not svc.pools:
            r.add(join(p, "endpoint"), "an endpoint service must provide at least one pool "
                  "(provides = { pools = [...] }): jobs reach it by reserving its pool")
        if svc.endpoint and svc.lifecycle == "manual":
            r.add(join(p, "lifecycle"), 'an endpoint service cannot be "manual": the agent must '
                  "start it to hand it its channel (use on_demand or always)")
        if svc.gpu.use != "none" and not gpu_compute:
            r.add(join(p, "gpu.use"), f'gpu use = "{svc.gpu.use}" needs [sandbox] '
                  'devices.gpu = "compute"')
        if svc.gpu.apis_any and svc.gpu.use == "none":
            r.add(join(p, "gpu.apis_any"), 'apis_any means nothing with use = "none": set use '
                  'to "shared" or "exclusive", or remove apis_any')
        for key in ("endpoint", "gpu"):
            if key in raw and not core_ok:
                got = f'requires.core is "{core}"' if core else "requires.core is missing"
                r.add(join(p, key), f'"{key}" on a service needs requires.core with a lower '
                      f'bound of at least 2.5 (e.g. ">=2.5,<3"); {got}')

    raw_req: dict[str, Any] = doc["requires"] if isinstance(doc.get("requires"), dict) else {}
    # A wrongly typed value was reported where it was read; here only missing or empty counts.
    if services and raw_req.get("service_protocol", MISSING) in (MISSING, []):
        r.add("requires.service_protocol", "required, non-empty, when services are declared "
              "(write service_protocol = [1])")

    stage_seen: dict[str, str] = {}
    for stage, p in stages:
        if stage.name:
            if stage.name in stage_seen:
                r.add(join(p, "name"),
                      f'duplicate stage name "{stage.name}" (also {stage_seen[stage.name]})')
            stage_seen.setdefault(stage.name, join(p, "name"))
        wanted = [(join(join(p, "requires.pools"), pool), pool) for pool in stage.pools]
        wanted += [(join(join(p, "requires.needs_pools"), i), pool)
                   for i, pool in enumerate(stage.needs_pools)]
        for key, pool in wanted:
            if pool in provided:
                continue
            if pool == upstream.CONTAINERS_POOL:  # upstream's agent's own pool, no service's
                upstream.note_containers_pool(r, key, stage.name)
            else:
                r.add(key, f'no service provides pool "{pool}"' + _known_pools(provided))

    if has_ui and "ui_contract" not in raw_req:
        r.add("requires.ui_contract", "required when [ui] pages or panels are declared "
              '(e.g. ui_contract = ">=1.2")')


def _known_pools(provided: dict[str, str]) -> str:
    if not provided:
        return " (no service declares provides.pools)"
    return " (provided pools: " + ", ".join(sorted(provided)) + ")"


def _d(value: Any) -> str:
    from ..valuekind import TABLE, describe

    return describe(value, mapping=TABLE)
