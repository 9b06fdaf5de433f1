"""The page checker reads upstream's forms too (contract section 7): ``link.to`` as a string or a
typed target object, kv items as ``{label, field?, value?, type?, format?}`` with ``key`` kept as
an alias. Pages as upstream's modelserver writes them pass ``oarbank-sdk check``; each broken
form is named at its JSON path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oarbank_sdk.pages import check_page_data

SOURCE = {"query": "services", "params": {"node_id": "$node", "service": "model"}}

# What upstream's modelserver ships (the forms `check` rejected before, see issue 13).
UPSTREAM_OVERVIEW = {
    "ui_contract": "1.2", "title": "Model",
    "body": [{"type": "section", "title": "Links", "children": [
        {"type": "text", "text": "Where to look next"},
        {"type": "link", "text": "docs", "to": "/docs"},
        {"type": "link", "text": "health", "to": {"tab": "health"}},
        {"type": "link", "text": "the node", "to": {"node": "$node"}},
        {"type": "link", "text": "job 7", "to": {"job": 7}},
        {"type": "link", "text": "runbook", "to": {"url": "https://example.org/runbook"}},
    ]}],
}
UPSTREAM_PANEL = {
    "ui_contract": "1.2",
    "body": [
        {"type": "text", "text": "model service"},
        {"type": "kv", "requires": "1.2", "source": SOURCE, "items": [
            {"label": "state", "field": "state", "type": "status"},
            {"label": "why stopped", "field": "stopped_reason"},
            {"label": "jobs using it", "field": "users", "type": "integer"},
            {"label": "last report", "field": "reported_at", "format": "relative"},
            {"label": "served by", "value": "oarbank"},
            {"key": "health"},  # our form, next to theirs
            "error",
        ]},
        {"type": "kv", "items": [{"label": "model", "value": "stand-in"}]},  # no data read
    ],
}


def problems(doc: Any) -> dict[str, str]:
    return {p.key.removeprefix("p.json: "): p.message
            for p in check_page_data(doc, "page", "p.json")}


def test_upstream_forms_pass_the_checker() -> None:
    assert problems(UPSTREAM_OVERVIEW) == {}
    assert problems(UPSTREAM_PANEL) == {}


def test_check_accepts_a_module_whose_pages_use_upstream_forms(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "modelserver"
    (tmp_path / "ui" / "pages").mkdir(parents=True)
    (tmp_path / "ui" / "panels").mkdir()
    (tmp_path / "oarbank-module.toml").write_text((example / "oarbank-module.toml").read_text())
    (tmp_path / "ui" / "pages" / "overview.json").write_text(json.dumps(UPSTREAM_OVERVIEW))
    (tmp_path / "ui" / "panels" / "node.json").write_text(json.dumps(UPSTREAM_PANEL))
    done = subprocess.run([sys.executable, "-m", "oarbank_sdk", "check", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip() == f"{tmp_path}: ok dev.example.modelserver 0.1.0"


def link(to: Any) -> dict:
    return {"ui_contract": "1.2", "body": [{"type": "link", "text": "x", "to": to}]}


def kv(*items: Any, source: bool = True) -> dict:
    comp: dict[str, Any] = {"type": "kv", "requires": "1.2", "items": list(items)}
    if source:
        comp["source"] = SOURCE
    return {"ui_contract": "1.2", "body": [comp]}


@pytest.mark.parametrize(("to", "key", "fragment"), [
    ({"tab": "a", "page": "b"}, "body[0].to", "exactly one of job, node, dataset, campaign, "
                                              "page, tab, url, this one names tab, page"),
    ({}, "body[0].to", "names exactly one of"),
    ({"tabs": "health"}, "body[0].to", "this one has 'tabs'"),
    ({"url": "http://example.org"}, "body[0].to.url", "must be https://"),
    ({"url": "javascript:alert(1)"}, "body[0].to.url", "must be https://"),
    ({"page": ""}, "body[0].to.page", "non-empty string"),
    ({"node": ["a"]}, "body[0].to.node", "got a list"),
    (["/x"], "body[0].to", "a string path or a target object"),
    (3, "body[0].to", "got an integer"),
])
def test_bad_link_targets_are_named(to: Any, key: str, fragment: str) -> None:
    found = problems(link(to))
    assert key in found and fragment in found[key], found


@pytest.mark.parametrize(("items", "key", "fragment"), [
    ([{"label": "x", "field": "a", "key": "b"}], "body[0].items[0].key", "alias of `field`"),
    ([{"label": "x", "field": "a", "value": 1}], "body[0].items[0].value", "not both"),
    ([{"value": 1}], "body[0].items[0].label", "needs a label"),
    ([{"label": "x"}], "body[0].items[0].field", "required key is missing"),
    ([{"field": ""}], "body[0].items[0].field", "non-empty string"),
    ([{"field": "a", "format": 3}], "body[0].items[0].format", "got an integer"),
    ([{"field": "a", "type": True}], "body[0].items[0].type", "got a boolean"),
    ([7], "body[0].items[0]", "a field name or an item object"),
])
def test_bad_kv_items_are_named(items: list, key: str, fragment: str) -> None:
    found = problems(kv(*items))
    assert key in found and fragment in found[key], found


def test_key_and_field_may_agree() -> None:
    assert problems(kv({"field": "state", "key": "state"})) == {}


def test_a_kv_reading_fields_still_needs_its_source() -> None:
    found = problems(kv({"label": "state", "field": "state"}, source=False))
    assert found == {"body[0].source": "required key is missing"}
