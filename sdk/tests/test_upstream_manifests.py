"""Upstream's example modules (fixtures written here with their keys and values,
``manifests/upstream/``) pass ``oarbank-sdk check`` and ``conform``'s manifest check: every key,
source and component of upstream's that this project does not act on gets exactly one note
naming it; what upstream's own rules reject still fails, naming what is wrong. Real CLI runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from platform_marks import conform_kit  # sdk/tests

UPSTREAM = Path(__file__).parent / "manifests" / "upstream"
MODULES = ("gpuinfo", "modelserver", "reel", "taskbench", "toy")
SECTIONS = ["coordinator", "results", "goldens"]

# Each module's notes: (key, a text the message must hold), in the order check prints them.
EXPECTED: dict[str, list[tuple[str, str]]] = {
    "gpuinfo": [
        *[(s, "") for s in SECTIONS],
        ("runner.gpu", "GPU API"), ("runner.variants", "(windows, darwin)"),
        ("ui.icon", '"gpu"'),
        ("ui/pages/overview.json: body[1].children[0].source", 'query "platforms"'),
        ("ui/pages/overview.json: body[2].children[0].source", 'query "results"'),
    ],
    "modelserver": [
        *[(s, "") for s in SECTIONS], ("operations", "upstream's coordinator"),
        ("ui/pages/overview.json: body[1].children[0].source", 'query "campaigns"'),
        ("ui/pages/overview.json: body[1].children[1]", 'component "form"'),
    ],
    "reel": [
        *[(s, "") for s in SECTIONS], ("datasets", ""), ("operations", "(3 entries)"),
        ("runner.checkpoint_grace_s", "stop_grace_s (20 s)"),
        ("stages[0].checkpoint", "max_mb"),
        ("ui.icon", '"cube"'), ("ui.digest_line", "results"),
        ("ui.views", "frames, renders, pair"),
        ("ui.panels[0].when", '"job.module == self"'),
        ("ui/pages/overview.json: body[0].children[0]", 'component "gallery"'),
        ("ui/pages/overview.json: body[0].children[0].source", 'module view "frames"'),
        ("ui/pages/overview.json: body[1].children[0].children[0]", 'component "compare"'),
        ("ui/pages/overview.json: body[1].children[0].children[0].source", 'view "pair"'),
        ("ui/pages/overview.json: body[1].children[1].children[0]",
         'component "media" (and 1 more)'),
        ("ui/pages/overview.json: body[1].children[1].children[0].source",
         'view "renders" (computed by ui.view.compute) (and 2 more)'),
        ("ui/pages/overview.json: body[2].children[1]", 'component "form"'),
        ("ui/pages/data.json: body[0].children[0].source", 'query "datasets"'),
        ("ui/pages/data.json: body[0].children[1].to", "link to upload"),
        ("ui/pages/data.json: body[1].children[0].source", 'query "checkpoints" (and 1 more)'),
        ("ui/pages/data.json: body[2].children[0].source", 'query "campaigns"'),
    ],
    "taskbench": [
        ("coordinator", ""), ("secrets", "jobs here receive none"), ("results", ""),
        ("goldens", ""), ("operations", ""),
        ("sandbox.net", "(egress-allowlist)"), ("sandbox.container_sets", "container broker"),
        ("stages[1].secrets", "(provider_key)"),
        ("stages[1].requires.pools.containers", "jobs of stage attempt do not run"),
        ("ui/pages/overview.json: body[0].children[1].source", 'query "secrets"'),
        ("ui/pages/overview.json: body[1].children[0].source", 'query "images"'),
        ("ui/pages/overview.json: body[2].children[0].source", 'query "campaigns"'),
        ("ui/pages/overview.json: body[2].children[1]", 'component "form"'),
    ],
    "toy": [
        *[(s, "") for s in SECTIONS], ("operations", "(2 entries)"),
        ("ui.icon", '"cube"'), ("ui.digest_line", ""), ("ui.views", "sums"),
        ("ui.iframes", "explorer"),
        ("ui/pages/overview.json: body[0].children[0].source", 'query "results" (and 4 more)'),
        ("ui/pages/overview.json: body[1].children[0].source", 'module view "sums"'),
        ("ui/pages/overview.json: body[3].children[0]", 'component "iframe"'),
        ("ui/pages/overview.json: body[4]", 'component "action"'),
    ],
}
_NOTE = re.compile(r"^note (.+?): (accepted, not acted on: .+)$")


pytestmark = conform_kit


def sdk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_sdk", *args], capture_output=True,
                          text=True, timeout=60)


def copy(tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(UPSTREAM / name, tmp_path / name))


def notes_of(stdout: str) -> list[tuple[str, str]]:
    out = []
    for line in stdout.splitlines()[1:]:
        m = _NOTE.match(line)
        assert m, f"not a note line: {line!r}"
        out.append((m.group(1), m.group(2)))
    return out


@pytest.mark.parametrize("name", MODULES)
def test_check_passes_with_one_note_per_unacted_key(name: str) -> None:
    path = UPSTREAM / name
    done = sdk("check", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == f"{path}: ok dev.codonic.oarbank.{name} 0.1.0"
    notes = notes_of(done.stdout)
    assert [k for k, _ in notes] == [k for k, _ in EXPECTED[name]]
    for (key, message), (_, names) in zip(notes, EXPECTED[name], strict=True):
        assert names in message, (key, message)
        # A note says whose the thing is: upstream's, and what this project does instead.
        assert "upstream's" in message and ("not" in message or "none" in message), message


@pytest.mark.parametrize("name", MODULES)
def test_conform_manifest_check_passes_with_the_same_notes(name: str) -> None:
    done = sdk("conform", "--json", str(UPSTREAM / name))
    report = json.loads(done.stdout)
    manifest = [c for c in report["checks"] if c["name"] == "manifest"]
    assert manifest == [{"status": "ok", "name": "manifest",
                         "detail": f"dev.codonic.oarbank.{name} 0.1.0"}]
    checked = notes_of("\n" + sdk("check", str(UPSTREAM / name)).stdout.split("\n", 1)[1])
    assert [n for n in report["notes"] if n.startswith("note ")] == [
        f"note {k}: {m}" for k, m in checked]


# What upstream's own rules reject still fails here: (module, file, old, new, expected line).
WRONG = [
    ("toy", "oarbank-module.toml", 'icon = "cube"', 'icon = "rocket"',
     'ui.icon: "rocket" is not one of "cpu", "gpu", "dna", "chart", "flask", "cube", "bolt"'),
    ("toy", "oarbank-module.toml", '"sum = {sum:,d}"', '"sum = {Sum}"',
     'ui.digest_line: "{Sum}": a placeholder names one result field in lower snake case, '
     "{field} or {field:FORMAT}"),
    ("reel", "oarbank-module.toml", '"{frames:d} frames"', '"{frames:x} frames"',
     'ui.digest_line: "x" is not a field format; one of .Nf, .Ne, .N%, d, ,d, s, .Ns '
     "(N one or two digits)"),
    ("reel", "oarbank-module.toml", '[ui.views.pair]\nshape = "rows"', '[ui.views.pair]\nshape = "grid"',
     'ui.views.pair.shape: "grid" is not one of "rows", "kv", "series", "stat"'),
    ("reel", "oarbank-module.toml", '{ key = "index", type = "integer" }',
     '{ key = "index", type = "picture" }',
     'ui.views.frames.columns[1].type: "picture" is not one of "text", "number", "integer", '
     '"percent", "bytes", "duration", "relative_time", "timestamp", "bool", "digest", "code", '
     '"status", "job_ref", "node_ref", "dataset_ref", "campaign_ref", "artifact_ref", "link"'),
    ("toy", "oarbank-module.toml", 'entry = "ui/frames/explorer.html", ', "",
     "ui.iframes[0].entry: required key is missing"),
    ("toy", "oarbank-module.toml", '"resize", "navigate"', '"resize", "write.files"',
     'ui.iframes[0].bridge[4]: unknown bridge capability "write.files"; one of read.query, '
     "read.view, request.operation, resize, navigate"),
    ("reel", "oarbank-module.toml", "checkpoint_grace_s = 30", "checkpoint_grace_s = -1",
     "runner.checkpoint_grace_s: must be greater than 0, got -1"),
    ("reel", "oarbank-module.toml", 'when = "job.module == self"', "when = 3",
     "ui.panels[0].when: expected a string, got an integer (3)"),
    ("taskbench", "oarbank-module.toml", "pools = { containers = 1 }", "pools = { gpus = 1 }",
     'stages[1].requires.pools.gpus: no service provides pool "gpus" (no service declares '
     "provides.pools)"),
    ("toy", "ui/pages/overview.json", '{"view": "sums"}', '{"view": "sums2"}',
     'ui/pages/overview.json: body[1].children[0].source.view: no view "sums2": [ui.views] '
     "declares sums"),
    ("toy", "ui/pages/overview.json", '"view": "explorer"', '"view": "explore"',
     'ui/pages/overview.json: body[3].children[0].view: no frame "explore": [[ui.iframes]] '
     "declares explorer"),
    ("gpuinfo", "ui/pages/overview.json", '{"query": "platforms"}', '{"query": "widgets"}',
     'ui/pages/overview.json: body[1].children[0].source.query: no query "widgets": a portal '
     "answers services, nodes, node_metrics, jobs, attempts (upstream's console also results, "
     "campaigns, datasets, module_settings, module_events, store, secrets, images, platforms, "
     "checkpoints)"),
    ("reel", "ui/pages/overview.json", '"type": "compare", "requires": "1.1", ', '"type": "compare", ',
     'ui/pages/overview.json: body[1].children[0].children[0]: a "compare" component needs '
     '"requires": "1.1" (or later) and a "fallback" ("placeholder" or "drop"), so older '
     "consoles draw the fallback"),
    ("reel", "ui/pages/data.json", '"attempts", "fields": ["attempt_id", "job_id", "state"], "limit": 50',
     '"attempts", "limit": 500',
     "ui/pages/data.json: body[1].children[1].source.limit: at most 200 rows, got 500"),
    ("reel", "ui/pages/data.json", '{"kind": "upload", "then": "self.adopt_upload"}', '{"then": "x"}',
     "ui/pages/data.json: body[0].children[1].to.upload.kind: required: the dataset kind an "
     "upload registers, a non-empty string (got null)"),
    ("modelserver", "ui/pages/overview.json", '{"query": "campaigns", ',
     '{"query": "campaigns", "view": "x", ',
     "ui/pages/overview.json: body[1].children[0].source: a source names a host query (query) "
     "or a module view (view), not both"),
]


@pytest.mark.parametrize(("name", "file", "old", "new", "expected"), WRONG,
                         ids=[w[4].split(":")[0] + ":" + w[4].split(":")[1][:30] for w in WRONG])
def test_what_upstream_rejects_still_fails_naming_it(tmp_path: Path, name: str, file: str,
                                                    old: str, new: str, expected: str) -> None:
    mod = copy(tmp_path, name)
    target = mod / file
    text = target.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"fixture changed: {old!r} not found once in {file}"
    target.write_text(text.replace(old, new), encoding="utf-8")
    done = sdk("check", str(mod))
    assert done.returncode == 1, done.stdout
    assert done.stdout.splitlines() == [f"{mod}: INVALID", expected]
    conform = json.loads(sdk("conform", "--json", str(mod)).stdout)
    assert conform["checks"][0]["status"] == "FAIL" and expected in conform["checks"][0]["detail"]
