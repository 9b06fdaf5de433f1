"""The conformance kit's goldens (``kit``'s step 5): each ``goldens/*.json`` through the
module's runner, with a connector the kit brokers itself; every key of ``expected.payload``
must equal the result's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from oarbank_sdk import advice
from oarbank_sdk import manifest as _manifest
from oarbank_sdk.conform import host, inputs
from oarbank_sdk.conform.report import FAIL, OK, SKIP, Report
from oarbank_sdk.conform.service import ServiceUnderTest, Wrap, gpu_compute

__all__ = ["load_json", "run_attempt", "run_goldens"]


# --- goldens -----------------------------------------------------------------------------------


def load_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except OSError as exc:
        return None, f"cannot read {path.name}: {exc}"
    except ValueError as exc:
        return None, f"{path.name} is not JSON: {exc}"


def _golden_problem(g: Any) -> str | None:
    if not isinstance(g, dict):
        return "must be a JSON object"
    for key, kind in (("name", str), ("stage", str), ("payload", dict), ("expected", dict)):
        if not isinstance(g.get(key), kind):
            return f"'{key}' must be {'a string' if kind is str else 'an object'}"
    if not isinstance(g["expected"].get("payload"), dict):
        return "'expected.payload' must be an object"
    return None


def _short(value: Any, n: int = 160) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= n else text[: n - 3] + "..."


def run_goldens(m: _manifest.Manifest, node: host.NodeDirs, sut: dict[str, ServiceUnderTest],
                 wrap: Wrap, report: Report) -> None:
    gdir = m.bundle / "goldens"
    files = sorted(gdir.glob("*.json")) if gdir.is_dir() else []
    if not files:
        report.add(SKIP, "goldens", "no goldens/*.json")
        return
    if m.runner is None:
        report.add(FAIL, "goldens", f"{len(files)} golden(s) but the manifest has no [runner]")
        return
    for i, path in enumerate(files):
        name = f"golden {path.stem}"
        g, err = load_json(path)
        skip = None if err else inputs.upstream_golden(g)
        if skip:
            report.add(SKIP, name, f"{path.name}: {skip}")
            continue
        err = err or _golden_problem(g)
        if err:
            report.add(FAIL, name, f"{path.name}: {err}")
            continue
        stage = m.stage(g["stage"])
        if stage is None:
            report.add(FAIL, name, f"stage {g['stage']!r} is not in the manifest")
            continue
        attempt = f"conform-golden-{i + 1}"
        t0 = time.monotonic()
        a, not_ready = run_attempt(m, node, sut, wrap, stage, g["payload"], attempt)
        if a is None:
            report.add(SKIP, name, f"needs service(s) {not_ready}, not ready")
            continue
        elapsed = time.monotonic() - t0
        if a.rc is None:
            report.add(FAIL, name, f"runner did not finish within timeout_s ({stage.timeout_s:g} s)")
            continue
        if a.rc != 0:
            why = (f"{a.failure.get('reason')}: {a.failure.get('detail')}" if a.failure
                   else a.stderr.strip().replace("\n", " | ")[-300:])
            report.add(FAIL, name, f"runner exit {a.rc}: {why}")
            continue
        raw, err = load_json(a.workdir / "result.json")
        problem = err or advice.envelope_problem(raw)
        if problem:
            report.add(FAIL, name, problem)
            continue
        result = raw
        diffs = []
        for key, want in g["expected"]["payload"].items():
            if key not in result["payload"]:
                diffs.append(f"payload.{key}: missing (expected {_short(want)})")
            elif result["payload"][key] != want:
                diffs.append(f"payload.{key}: expected {_short(want)}, got "
                             f"{_short(result['payload'][key])}")
        if diffs:
            report.add(FAIL, name, "; ".join(diffs))
        else:
            report.add(OK, name, f"{len(g['expected']['payload'])} key(s) match "
                       f"({a.connects} connection(s), {elapsed:.2f} s)")


def run_attempt(m: _manifest.Manifest, node: host.NodeDirs, sut: dict[str, ServiceUnderTest],
                wrap: Wrap, stage: _manifest.Stage, payload: Any, attempt: str,
                **run_kwargs: Any) -> tuple[host.Attempt | None, list[str]]:
    """One attempt of ``stage`` through the module's runner, sandboxed with the agent's walls
    and a connector to each endpoint service whose pool the stage reserves: ``(attempt,
    [])``, or ``(None, services)`` when some of those services are not ready (nothing run).
    ``run_kwargs`` go to ``host.run_runner`` (``spec_extra``, ``prepare``, ``events``)."""
    assert m.runner is not None
    needed = []
    for pool in stage.pools:
        svc = m.service_for_pool(pool)
        if svc is not None and svc.endpoint:
            needed.append(svc.name)
    not_ready = [s for s in needed if not (s in sut and sut[s].ready)]
    if not_ready:
        return None, not_ready
    connectors = {}
    for s in needed:
        ch = sut[s].channel
        assert ch is not None  # a ready service has its channel
        connectors[s] = host.Connector(attempt, ch)
    try:
        walls = {"read": [m.bundle, node.settings_file, *node.env_reads],
                 "write": [node.root / "attempts" / attempt],  # <W>, made by run_runner
                 "gpu": gpu_compute(m)}
        a = host.run_runner(wrap(node.expand(m.runner.exec, m.bundle), **walls), node, attempt,
                            stage.name, payload, dict(stage.pools), connectors, m.bundle,
                            stage.timeout_s, extra_env=dict(m.runner.env),
                            grace_s=m.runner.stop_grace_s, **run_kwargs)
    finally:
        # The attempt is over: close its connectors, tell every service it reached.
        for s, c in connectors.items():
            c.close()
            ch = sut[s].channel
            if ch is not None and ch.is_open:
                ch.ended(attempt)
    return a, []
