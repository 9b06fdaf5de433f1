"""Keys of upstream's manifest that this project accepts without acting on them.

A module written for upstream's platform must check, preview and load here unchanged
(contract section 1). Each key below is checked by upstream's own rules (a wrong value is still
an error, naming the key) and then gets one ``Note``: whose the key is and what this project
does instead. Nothing here decides how a module runs; the checker (``checker.py``) calls in.

- passed-over top-level sections (``[coordinator]``, ``[results]``, ``[[operations]]``, ...):
  one note per section;
- ``[ui]``: ``icon`` (one of upstream's icons), ``digest_line`` (``{field}`` /
  ``{field:FORMAT}`` only), ``views`` (``shape`` and typed ``columns``), ``iframes`` (``id``,
  ``entry``, ``title``, ``bridge``), ``external_urls``, ``study_columns``; ``when`` on a page or
  panel entry;
- ``runner.checkpoint_grace_s``, ``runner.gpu``, ``runner.variants``; ``stages[].checkpoint``,
  ``stages[].secrets``; the agent's ``containers`` pool; ``[sandbox]`` ``net``,
  ``containers``, ``container_sets``, ``tools``.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from .reader import MISSING, Reader, join

__all__ = [
    "CONTAINERS_POOL",
    "ICONS",
    "IFRAME_BRIDGE",
    "UI_UPSTREAM_KEYS",
    "VIEW_COLUMN_TYPES",
    "VIEW_SHAPES",
    "iframe_ids",
    "note_section",
    "note_sandbox",
    "note_stage",
    "runner_extras",
    "ui_extras",
    "view_ids",
]

# Upstream's agent's own pool: its container broker's slots (a stage running images holds one).
CONTAINERS_POOL = "containers"
ICONS = ("cpu", "gpu", "dna", "chart", "flask", "cube", "bolt")
VIEW_SHAPES = ("rows", "kv", "series", "stat")
VIEW_COLUMN_TYPES = ("text", "number", "integer", "percent", "bytes", "duration",
                     "relative_time", "timestamp", "bool", "digest", "code", "status",
                     "job_ref", "node_ref", "dataset_ref", "campaign_ref", "artifact_ref", "link")
IFRAME_BRIDGE = ("read.query", "read.view", "request.operation", "resize", "navigate")
UI_UPSTREAM_KEYS = ("icon", "digest_line", "views", "iframes", "external_urls", "study_columns")

_NOT_HERE = "accepted, not acted on: "
_SECTIONS = {
    "coordinator": "upstream's coordinator (the module protocol: plans, operations, views) is "
                   "not run by this project",
    "results": "result schemas, digests and fields are upstream's coordinator's; this agent "
               "reads only max_inline_kb from it",
    "goldens": "upstream's coordinator compares goldens; oarbank-sdk conform reads "
               "goldens/*.json itself (an upstream-format golden is skipped there)",
    "operations": "module operations are registered and run by upstream's coordinator, not by "
                  "this portal",
    "probes": "capability probes are run by upstream's agent, not by this agent",
    "datasets": "datasets are kept by upstream's coordinator, not by this project",
    "secrets": "secrets are set and handed out by upstream's coordinator, not by this agent: "
               "jobs here receive none",
    "settings": "the settings schema is upstream's coordinator's; conform.json settings are "
                "what this project hands a service",
    "cli": "the module CLI runs on upstream's coordinator, not here",
    "placement": "placement across platform classes is upstream's coordinator's",
    "bundle": "bundle file modes and per-platform files are applied by upstream's installer",
}
_DIGEST_FORMAT = re.compile(r"^(\.\d{1,2}[fe%s]|d|,d|s)$")
_DIGEST_FIELD = re.compile(r"^[a-z][a-z0-9_]*$")


def note_section(r: Reader, key: str, value: Any) -> None:
    """One note for a top-level section this project passes over."""
    why = _SECTIONS.get(key, "a section of upstream's platform that this project does not use")
    count = f" ({len(value)} entries)" if isinstance(value, list) and len(value) > 1 else ""
    r.note(key, _NOT_HERE + why + count)


# -- [ui] -----------------------------------------------------------------------------------


def ui_extras(r: Reader, ui: dict[str, Any]) -> None:
    """Upstream's [ui] keys: checked by upstream's rules, then one note each."""
    icon = r.one_of(ui.get("icon", MISSING), "ui.icon", ICONS)
    if icon is not None:
        r.note("ui.icon", _NOT_HERE + f'the module icon "{icon}" is drawn by upstream\'s '
               "console, not by this portal")
    line = r.string(ui.get("digest_line", MISSING), "ui.digest_line")
    if line is not None and _digest_line(r, line):
        r.note("ui.digest_line", _NOT_HERE + "upstream's console fills it from the module's "
               "results, which this project does not keep; this portal does not show it")
    views = _views(r, ui.get("views", MISSING))
    if views:
        r.note("ui.views", _NOT_HERE + f"module views {', '.join(views)} are computed by "
               "upstream's coordinator (ui.view.compute), not by this portal: components "
               "reading them preview as placeholders")
    frames = _iframes(r, ui.get("iframes", MISSING))
    if frames:
        r.note("ui.iframes", _NOT_HERE + f"frames {', '.join(frames)} are served from "
               "upstream's module origin, not by this portal: iframe components preview as "
               "placeholders")
    urls = r.string_list(ui.get("external_urls", MISSING), "ui.external_urls", default=None)
    if urls is not None:
        r.note("ui.external_urls", _NOT_HERE + "upstream's console's link allowlist; this "
               "portal links any https target a page names")
    if "study_columns" in ui:
        r.note("ui.study_columns", _NOT_HERE + "studies are upstream's coordinator's, not "
               "this portal's")


def note_when(r: Reader, value: Any, path: str) -> None:
    """``when`` on a [ui] page or panel entry."""
    when = r.string(value, path)
    if when is not None:
        r.note(path, _NOT_HERE + f'the condition "{when}" is evaluated by upstream\'s console, '
               "not by this portal: the entry is always shown")


def _digest_line(r: Reader, line: str) -> bool:
    """Upstream's template: text, ``{field}`` / ``{field:FORMAT}``, ``{{`` and ``}}``."""
    i = 0
    while i < len(line):
        ch = line[i]
        if line.startswith(("{{", "}}"), i):
            i += 2
            continue
        if ch == "}":
            r.add("ui.digest_line", f"a lone '}}' at character {i + 1}: write }}}} for a brace")
            return False
        if ch == "{":
            end = line.find("}", i)
            if end < 0:
                r.add("ui.digest_line", f"'{{' at character {i + 1} is never closed")
                return False
            field, _, fmt = line[i + 1:end].partition(":")
            if not _DIGEST_FIELD.match(field):
                r.add("ui.digest_line", f'"{{{line[i + 1:end]}}}": a placeholder names one '
                      "result field in lower snake case, {field} or {field:FORMAT}")
                return False
            if fmt and not _DIGEST_FORMAT.match(fmt):
                r.add("ui.digest_line", f'"{fmt}" is not a field format; one of .Nf, .Ne, .N%, '
                      "d, ,d, s, .Ns (N one or two digits)")
                return False
            i = end + 1
            continue
        i += 1
    return True


def _views(r: Reader, value: Any) -> list[str]:
    views = r.table(value, "ui.views")
    out = []
    for vid, view in (views or {}).items():
        p = join("ui.views", vid)
        t = r.table(view, p)
        if t is None:
            continue
        out.append(vid)
        r.one_of(r.get(t, "shape", p, required=True), join(p, "shape"), VIEW_SHAPES)
        r.string_list(t.get("inputs", MISSING), join(p, "inputs"))
        r.table(t.get("params", MISSING), join(p, "params"))
        for key in ("refresh_s", "max_rows"):
            r.positive_int(t.get(key, MISSING), join(p, key))
        cols = t.get("columns", MISSING)
        if cols is MISSING:
            continue
        if not isinstance(cols, list):
            r.add(join(p, "columns"), "expected a list of columns ({key, type?, ...})")
            continue
        for i, col in enumerate(cols):
            cp = join(join(p, "columns"), i)
            c = r.table(col, cp)
            if c is None:
                continue
            r.string(r.get(c, "key", cp, required=True), join(cp, "key"), nonempty=True)
            r.string(c.get("label", MISSING), join(cp, "label"))
            r.one_of(c.get("type", MISSING), join(cp, "type"), VIEW_COLUMN_TYPES)
            r.one_of(c.get("direction", MISSING), join(cp, "direction"), ("min", "max"))
    return out


def _iframes(r: Reader, value: Any) -> list[str]:
    if value is MISSING:
        return []
    if not isinstance(value, list):
        r.add("ui.iframes", "expected a list of frames ({id, entry, title, bridge?})")
        return []
    out: list[str] = []
    for i, item in enumerate(value):
        p = join("ui.iframes", i)
        t = r.table(item, p)
        if t is None:
            continue
        fid = r.string(r.get(t, "id", p, required=True), join(p, "id"), nonempty=True)
        entry = r.string(r.get(t, "entry", p, required=True), join(p, "entry"), nonempty=True)
        r.string(r.get(t, "title", p, required=True), join(p, "title"), nonempty=True)
        bridge = r.string_list(t.get("bridge", MISSING), join(p, "bridge"))
        for j, cap in enumerate(bridge):
            if cap not in IFRAME_BRIDGE:
                r.add(join(join(p, "bridge"), j), f'unknown bridge capability "{cap}"; one of '
                      + ", ".join(IFRAME_BRIDGE))
        if entry and (entry.startswith(("/", "{bundle}")) or ".." in PurePosixPath(entry).parts):
            r.add(join(p, "entry"), f'"{entry}" must be a path inside the bundle, relative to '
                  "it (e.g. ui/frames/explorer.html)")
        if fid:
            if fid in out:
                r.add(join(p, "id"), f'duplicate frame id "{fid}"')
            else:
                out.append(fid)
    return out


def view_ids(raw: dict[str, Any]) -> list[str]:
    """The module views a (checked) manifest declares under [ui.views]."""
    ui = raw.get("ui")
    views = ui.get("views") if isinstance(ui, dict) else None
    return list(views) if isinstance(views, dict) else []


def iframe_ids(raw: dict[str, Any]) -> list[str]:
    """The frame ids a (checked) manifest declares under [[ui.iframes]]."""
    ui = raw.get("ui")
    frames = ui.get("iframes") if isinstance(ui, dict) else None
    if not isinstance(frames, list):
        return []
    return [f["id"] for f in frames if isinstance(f, dict) and isinstance(f.get("id"), str)]


# -- [runner], [[stages]], [sandbox] ------------------------------------------------------------


def runner_extras(r: Reader, t: dict[str, Any], grace: float) -> None:
    value = r.positive_number(t.get("checkpoint_grace_s", MISSING), "runner.checkpoint_grace_s")
    if value is not None:
        r.note("runner.checkpoint_grace_s", _NOT_HERE + "it is upstream's agent's grace; a "
               "stop this agent asks for asks for a checkpoint first and is waited for the "
               "agent's --release-grace-s (a drain: its --drain-s); the end of a timed-out "
               f"attempt is bounded by stop_grace_s ({grace:g} s)")
    if "gpu" in t and r.table(t["gpu"], "runner.gpu") is not None:
        r.note("runner.gpu", _NOT_HERE + "placing jobs by GPU API is upstream's coordinator's; "
               "this agent runs a job where it is submitted (a runner's GPU devices come from "
               "[sandbox].devices.gpu)")
    variants = r.table(t.get("variants", MISSING), "runner.variants")
    if variants:
        r.note("runner.variants", _NOT_HERE + f"per-platform runners ({', '.join(variants)}) "
               "are chosen by upstream's agent, not by this agent: [runner] runs as written on "
               "every platform")


def note_stage(r: Reader, t: dict[str, Any], p: str) -> None:
    if "checkpoint" in t and r.table(t["checkpoint"], join(p, "checkpoint")) is not None:
        r.note(join(p, "checkpoint"), _NOT_HERE + "min_interval_s is upstream's agent's; "
               "this agent reads only max_mb (the most a checkpoint it keeps for the job's "
               "next attempt may hold; default 256)")
    secrets = r.string_list(t.get("secrets", MISSING), join(p, "secrets"), default=None)
    if secrets:
        r.note(join(p, "secrets"), _NOT_HERE + f"secrets ({', '.join(secrets)}) are handed out "
               "by upstream's coordinator, not by this agent: the stage's jobs receive none here")


def note_containers_pool(r: Reader, path: str, stage: str) -> None:
    r.note(path, _NOT_HERE + f'the "{CONTAINERS_POOL}" pool is upstream\'s agent\'s container '
           "broker, not a service's: this agent runs no containers and has no tokens of it, so "
           f"jobs of stage {stage} do not run on this agent")


def note_sandbox(r: Reader, sandbox: dict[str, Any]) -> None:
    net = sandbox.get("net", MISSING)
    mode = net.get("mode", "none") if isinstance(net, dict) else net
    if net is not MISSING and mode != "none":
        r.note("sandbox.net", _NOT_HERE + f"network egress ({mode if isinstance(mode, str) else net}"
               ") goes through upstream's agent's proxy; this agent's sandbox gives a child no "
               "network and refuses to load a module that asks for it")
    if sandbox.get("containers"):
        r.note("sandbox.containers", _NOT_HERE + "container images are run by upstream's "
               "agent's container broker; this agent runs none and refuses to load a module "
               "that lists them")
    if sandbox.get("container_sets"):
        r.note("sandbox.container_sets", _NOT_HERE + "signed image sets are run by upstream's "
               "agent's container broker; this agent runs none")
    if sandbox.get("tools"):
        r.note("sandbox.tools", _NOT_HERE + "host tools are granted by upstream's agent; this "
               "agent grants a child none")
