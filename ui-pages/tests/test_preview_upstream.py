"""`oarbank-portal preview` of upstream's example modules (the SDK's fixtures
``sdk/tests/manifests/upstream/``): each previews; what upstream's console serves and this
portal does not is a placeholder that says why, and each such key, source or component is
said once on stderr, the same notes ``oarbank-sdk check`` prints."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from oarbank_sdk.manifest import load
from oarbank_sdk.pages import module_notes

UPSTREAM = Path(__file__).resolve().parents[2] / "sdk" / "tests" / "manifests" / "upstream"
MODULES = ("gpuinfo", "modelserver", "reel", "taskbench", "toy")
_PLACEHOLDER = re.compile(r'<div class="component placeholder"[^>]*>([^<]*)'
                          r'(?:<span class="why"> \((.*?)\)</span>)?</div>')


def preview(module: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_ui.cli", "preview", str(module),
                           "--out", str(out)], capture_output=True, text=True, timeout=60)


def placeholders(page: Path) -> list[tuple[str, str]]:
    return [(html.unescape(t), html.unescape(w or ""))
            for t, w in _PLACEHOLDER.findall(page.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("name", MODULES)
def test_upstream_module_previews_and_says_each_note_once(tmp_path: Path, name: str) -> None:
    r = preview(UPSTREAM / name, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    expected = [f"oarbank-portal: note: {n}" for n in module_notes(load(UPSTREAM / name))]
    assert expected and r.stderr.splitlines() == expected  # no page problems, no warnings
    for page in (tmp_path / "out").glob("p*-*.html"):
        for text, why in placeholders(page):
            assert why, f"{page.name}: a placeholder without a reason: {text!r}"


def test_toy_placeholders_say_why(tmp_path: Path) -> None:
    r = preview(UPSTREAM / "toy", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    found = placeholders(tmp_path / "out" / "page-overview.html")
    # stat, table, chart are drawn here; what they read is upstream's (its results query,
    # its module view); iframe and action need its coordinator.
    served = "served by upstream's coordinator, not by this portal"
    assert found == [
        (served, 'stat of query "results"'), (served, 'stat of query "results"'),
        (served, 'table of module view "sums" (computed by ui.view.compute)'),
        (served, 'table of query "results"'), (served, 'chart of query "results"'),
        ("not supported by this console version", "iframe: frames are served from upstream's "
         "module origin, not by this portal"),
        ("not supported by this console version", "action: it runs a module operation, which "
         "upstream's coordinator runs, not this portal"),
    ]
    panel = placeholders(tmp_path / "out" / "panel-job_sum.html")
    assert panel == [("served by upstream's coordinator, not by this portal",
                      'kv of query "results"')]


def test_our_query_renders_from_fixtures_an_upstream_one_is_a_placeholder(tmp_path: Path) -> None:
    # The fixture folder holds campaigns.json too: this portal never serves campaigns, so the
    # preview must not pretend it does.
    r = preview(UPSTREAM / "modelserver", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    page = tmp_path / "out" / "page-overview.html"
    text = page.read_text(encoding="utf-8")
    assert "host-one" in text  # the services table, from fixtures/ui/queries/services.json
    assert "first prompts" not in text  # campaigns.json is not shown
    assert placeholders(page) == [
        ("served by upstream's coordinator, not by this portal", 'table of query "campaigns"'),
        ("not supported by this console version", "form: it runs a module operation, which "
         "upstream's coordinator runs, not this portal"),
    ]
    panel = (tmp_path / "out" / "panel-node_model.html").read_text(encoding="utf-8")
    assert "ready" in panel and "placeholder" not in panel


def test_upload_link_is_text_and_drop_fallbacks_drop(tmp_path: Path) -> None:
    r = preview(UPSTREAM / "reel", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    data = (tmp_path / "out" / "page-data.html").read_text(encoding="utf-8")
    assert re.search(r'<span class="unlinked" title="[^"]*">Upload a folder</span>', data)
    # The attempts table says fallback "drop": not a placeholder, not there at all.
    assert [w for _, w in placeholders(tmp_path / "out" / "page-data.html")] == [
        'table of query "datasets"', 'table of query "checkpoints"', 'table of query "campaigns"']
    overview = placeholders(tmp_path / "out" / "page-overview.html")
    assert [w.split(":")[0] for _, w in overview] == ["gallery", "compare", "media", "table of "
                                                      'module view "renders" (computed by '
                                                      "ui.view.compute)", "form"]


EVERY = [
    {"type": "section", "title": "s", "span": 2, "children": [{"type": "text", "text": "t"}]},
    {"type": "tabs", "tabs": [{"title": "one", "children": [{"type": "markdown", "text": "*m*"}]}]},
    {"type": "columns", "children": [
        {"type": "stat", "label": "ready", "field": "users", "requires": "1.2",
         "source": {"query": "services", "agg": {"users": "sum"}}},
        {"type": "progress", "label": "p", "value": "users", "total": "users", "requires": "1.2",
         "source": {"query": "services"}}]},
    {"type": "kv", "items": [{"label": "a", "value": 1}]},
    {"type": "status", "label": "s", "field": "state", "requires": "1.2",
     "source": {"query": "services"}},
    {"type": "callout", "text": "c"}, {"type": "empty", "text": "e"},
    {"type": "table", "requires": "1.2", "source": {"query": "services"}, "columns": [{"key": "node_id"}],
     "page_size": 5},
    {"type": "chart", "kind": "bar", "requires": "1.2", "source": {"query": "services"},
     "x": "hostname", "y": ["users"], "summary": "users per host"},
    {"type": "logs", "field": "hostname", "requires": "1.2", "source": {"query": "services"}},
    {"type": "json", "requires": "1.2", "source": {"query": "services"}},
    {"type": "link", "text": "l", "to": {"page": "overview"}},
    {"type": "form", "schema": "s.json", "submit": {"op": "self.x"}},
    {"type": "filter_bar", "vars": [{"name": "x"}]},
    {"type": "action", "action": {"op": "self.x"}},
    {"type": "media", "requires": "1.2", "fallback": "placeholder", "kind": "image",
     "source": {"query": "services"}, "field": "x"},
    {"type": "gallery", "requires": "1.2", "fallback": "placeholder",
     "source": {"query": "services"}, "field": "x"},
    {"type": "compare", "requires": "1.2", "fallback": "placeholder",
     "source": {"query": "services"}, "left": "a", "right": "b"},
    {"type": "iframe", "view": "x", "title": "frame"},
]


def test_every_component_of_the_contract_previews_and_only_coordinator_ones_are_placeholders(
        tmp_path: Path) -> None:
    import shutil

    mod = tmp_path / "mod"
    shutil.copytree(UPSTREAM.parents[3] / "examples" / "modelserver", mod,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (mod / "ui" / "pages" / "overview.json").write_text(json.dumps(
        {"ui_contract": "1.2", "title": "every", "body": EVERY}))
    r = preview(mod, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    page = tmp_path / "out" / "page-overview.html"
    assert [w.split(":")[0] for _, w in placeholders(page)] == [
        "form", "filter_bar", "action", "media", "gallery", "compare", "iframe"]
    text = page.read_text(encoding="utf-8")
    for drawn in ('class="component tabs"', 'class="component columns', 'class="component stat"',
                  'class="component progress"', 'class="component callout', "empty-state",
                  'class="component markdown"', "chart-svg", 'class="component logs"',
                  'class="component json"', 'class="component table"', "<em>m</em>"):
        assert drawn in text, drawn
