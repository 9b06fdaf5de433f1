"""The conformance kit's runner specs and the rest of ``conformance.json`` (``kit``'s step 6):
each ``runner_specs`` entry through the module's runner, and one line for each other kind of
entry the file holds, run or not, saying why.

A runner spec is ``{"name", "stage"?, "payload", "datasets"?, "mounts"?, "expect"?}``, as
upstream's kit reads it: ``stage`` defaults to the manifest's first stage; ``datasets`` names
entries of the file's ``datasets`` whose ``dir`` (in the bundle) is copied, read-only, into the
workdir under ``mounts[id]``; ``expect`` is ``{"exit"?: 0, "artifacts"?: [names], "reason"?}``.
The kit checks the exit code; for 0 the result envelope (and, if given, exactly those artifact
names, each file's ``local`` present in the workdir); otherwise ``failure.json``, and its
``reason`` if given.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

from oarbank_sdk import advice
from oarbank_sdk import manifest as _manifest
from oarbank_sdk.conform import host, inputs
from oarbank_sdk.conform.goldens import load_json, run_attempt
from oarbank_sdk.conform.report import FAIL, OK, SKIP, WARN, Report
from oarbank_sdk.conform.service import ServiceUnderTest, Wrap

__all__ = ["NOT_RUN", "RUN_HERE", "run_runner_specs", "spec_problem"]

# The kinds of entry this kit acts on, and where.
RUN_HERE = {
    "service_specs": "sent to the endpoint services (conform.specs)",
    "settings": "the services' and runners' settings file (conform.inputs)",
    "runner_specs": "run through the runner (here)",
    "datasets": "copied into a runner spec's workdir when it names them and they have a dir",
}
# The kinds upstream's kit reads that have no meaning on this project's node, and why.
NOT_RUN = {
    "ops": "coordinator operations (op.plan/op.apply): this project has no module coordinator",
    "params": "inputs to the coordinator's params.check: this project has no module coordinator",
    "store": "the coordinator's store: this project has no module coordinator",
    "node_classes": "node classes for the coordinator's goldens: this project has no module "
                    "coordinator; the kit runs on this host's platform",
    "secrets": "this agent delivers no secrets to jobs (no OARBANK_SECRETS_FILE)",
    "images": "container images of [[sandbox.container_sets]]: this agent runs no container "
              "broker and verifies no image",
    "tools": "host tools: this agent grants none (OARBANK_TOOLS_FILE is {})",
    "net": "the egress allowlist proxy: this agent runs none",
}
_SPEC_KEYS = {"name", "stage", "payload", "datasets", "mounts", "expect"}
_EXPECT_KEYS = {"exit", "artifacts", "reason"}
_EVENT_CAPABILITIES = ("events", "progress_events", "checkpoint")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def spec_problem(spec: Any) -> str | None:
    """What is wrong with one ``runner_specs`` entry's form, or None."""
    if not isinstance(spec, dict):
        return "must be a JSON object"
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
        return f"unknown key(s) {unknown}"
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        return "'name' must be a non-empty string"
    if "stage" in spec and (not isinstance(spec["stage"], str) or not spec["stage"]):
        return "'stage' must be a non-empty string"
    if not isinstance(spec.get("payload"), dict):
        return "'payload' must be an object"
    datasets = spec.get("datasets", [])
    if not isinstance(datasets, list) or not all(isinstance(d, str) for d in datasets):
        return "'datasets' must be a list of dataset ids"
    mounts = spec.get("mounts", {})
    if not isinstance(mounts, dict) or not all(isinstance(v, str) for v in mounts.values()):
        return "'mounts' must map dataset ids to folder names"
    for ds_id, where in mounts.items():
        if ds_id not in datasets:
            return f"'mounts' names {ds_id!r}, which 'datasets' does not list"
        if not _inside(where):
            return f"mount {where!r} must be a relative path inside the workdir"
    expect = spec.get("expect", {})
    if not isinstance(expect, dict) or set(expect) - _EXPECT_KEYS:
        return "'expect' must be an object with 'exit', 'artifacts' and/or 'reason'"
    if "exit" in expect and not (_is_int(expect["exit"]) and 0 <= expect["exit"] <= 255):
        return "'expect.exit' must be an exit code (0-255)"
    arts = expect.get("artifacts")
    if arts is not None and not (isinstance(arts, list) and all(isinstance(a, str) for a in arts)):
        return "'expect.artifacts' must be a list of names"
    if "reason" in expect and not isinstance(expect["reason"], str):
        return "'expect.reason' must be a string"
    return None


def _inside(rel: str) -> bool:
    parts = Path(rel).parts
    return bool(rel) and not Path(rel).is_absolute() and ".." not in parts and "\\" not in rel


def _copy_read_only(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=False)
    for root, _dirs, files in os.walk(dst):
        for f in files:
            p = Path(root) / f
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _events_declared(m: _manifest.Manifest) -> bool:
    runner = m.raw.get("runner")
    caps = runner.get("capabilities") if isinstance(runner, dict) else None
    return isinstance(caps, list) and any(c in caps for c in _EVENT_CAPABILITIES)


def _artifact_problem(result: dict[str, Any], workdir: Path, want: list[str] | None) -> str | None:
    arts = result.get("artifacts", [])
    if not isinstance(arts, list) or not all(isinstance(a, dict) for a in arts):
        return "result.json 'artifacts' must be a list of objects"
    names = [a.get("name") for a in arts]
    if want is not None and sorted(map(str, names)) != sorted(want):
        return f"artifacts {names}, expected {want}"
    for a in arts:
        for f in a.get("files", []) if isinstance(a.get("files"), list) else []:
            local = f.get("local") if isinstance(f, dict) else None
            if not isinstance(local, str) or not _inside(local) or not (workdir / local).is_file():
                return f"artifact {a.get('name')!r}: file {local!r} is not in the workdir"
    return None


def _outcome(a: host.Attempt, expect: dict[str, Any]) -> tuple[str, str]:
    want_exit = expect.get("exit", 0)
    if a.rc is None:
        return FAIL, "runner did not finish within the stage's timeout_s"
    failure = a.failure or {}
    said = f" ({failure.get('reason')}: {failure.get('detail')})" if failure else ""
    if a.rc != want_exit:
        tail = "" if failure else " | ".join(a.stderr.strip().splitlines()[-3:])[-300:]
        return FAIL, f"exit {a.rc}{said}{' ' + tail if tail else ''}, expected {want_exit}"
    if want_exit == 0:
        raw, err = load_json(a.workdir / "result.json")
        problem = err or advice.envelope_problem(raw) or _artifact_problem(
            raw, a.workdir, expect.get("artifacts"))
        if problem:
            return FAIL, problem
        names = [x.get("name") for x in raw.get("artifacts", [])]
        return OK, "exit 0, result written" + (f", artifacts {names}" if names else "")
    if not a.failure:
        return FAIL, f"exit {a.rc} without failure.json (a non-zero exit must write one)"
    if "reason" in expect and failure.get("reason") != expect["reason"]:
        return FAIL, f"exit {a.rc} with reason {failure.get('reason')!r}, expected {expect['reason']!r}"
    return OK, f"exit {a.rc}, reason {failure.get('reason')!r} as expected"


def _kinds(doc: dict[str, Any], report: Report) -> None:
    """One line for each kind of entry the file holds that this kit does not run."""
    for key in doc:
        if key in NOT_RUN:
            report.add(SKIP, f"conformance.json {key}", f"not run here: {NOT_RUN[key]}")
        elif key not in RUN_HERE:
            report.add(WARN, f"conformance.json {key}", "unknown key: neither this kit nor "
                       "upstream's reads it")


def run_runner_specs(m: _manifest.Manifest, node: host.NodeDirs,
                     sut: dict[str, ServiceUnderTest], wrap: Wrap, report: Report) -> None:
    path = m.bundle / inputs.CONFORMANCE_FILE
    doc, err = load_json(path) if path.exists() else (None, None)
    if err or not isinstance(doc, dict):
        return  # none (the service_specs step says so), or it fails the file, naming why
    _kinds(doc, report)
    if "runner_specs" not in doc:
        return  # a file of service specs alone: nothing to say here
    specs = doc["runner_specs"]
    if not isinstance(specs, list):
        report.add(FAIL, "runner_specs", f"{inputs.CONFORMANCE_FILE}: 'runner_specs' must be a list")
        return
    if not specs:
        report.add(SKIP, "runner_specs", f"{inputs.CONFORMANCE_FILE} lists none")
        return
    if m.runner is None or not m.stages:
        report.add(FAIL, "runner_specs", f"{len(specs)} runner spec(s) but the manifest has no "
                   "[runner] or no stage")
        return
    datasets = doc.get("datasets", {})
    datasets = datasets if isinstance(datasets, dict) else {}
    for i, spec in enumerate(specs):
        label = spec.get("name") if isinstance(spec, dict) and isinstance(spec.get("name"), str) else f"#{i}"
        name = f"runner spec {label}"
        problem = spec_problem(spec)
        if problem:
            report.add(FAIL, name, f"{inputs.CONFORMANCE_FILE} runner_specs[{i}]: {problem}")
            continue
        stage = m.stage(spec["stage"]) if "stage" in spec else m.stages[0]
        if stage is None:
            report.add(FAIL, name, f"stage {spec['stage']!r} is not in the manifest")
            continue
        if "containers" in stage.pools:
            report.add(SKIP, name, f"stage {stage.name} reserves the containers pool: this "
                       "agent runs no container broker")
            continue
        sources: dict[str, Path] = {}
        missing = None
        for ds_id in spec.get("datasets", []):
            ds = datasets.get(ds_id)
            folder = ds.get("dir") if isinstance(ds, dict) else None
            if not isinstance(folder, str) or not _inside(folder) or not (m.bundle / folder).is_dir():
                missing = (f"dataset {ds_id!r} has no 'dir' in the bundle to copy (its files "
                           "come from a coordinator's store, which this project does not have)")
                break
            sources[ds_id] = m.bundle / folder
        if missing:
            report.add(SKIP, name, missing)
            continue
        mounts = {ds_id: spec.get("mounts", {}).get(ds_id, ds_id.replace(":", "_"))
                  for ds_id in sources}

        def place(workdir: Path, sources: dict[str, Path] = sources,
                  mounts: dict[str, str] = mounts) -> None:
            for ds_id, src in sources.items():
                _copy_read_only(src, workdir / mounts[ds_id])

        a, not_ready = run_attempt(m, node, sut, wrap, stage, spec["payload"],
                                   f"conform-runner-spec-{i + 1}",
                                   spec_extra={"datasets": list(sources), "mounts": mounts},
                                   prepare=place, events=_events_declared(m))
        if a is None:
            report.add(SKIP, name, f"needs service(s) {not_ready}, not ready")
            continue
        status, detail = _outcome(a, spec.get("expect", {}))
        report.add(status, name, detail)
