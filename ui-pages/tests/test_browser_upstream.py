"""A module whose page and panel are written in upstream's forms (typed link targets, kv items
``{label, field?, value?}``), shown by the portal in headless Chromium: targets the portal has a
page for are links, the others plain text; kv values come from the source and update live."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser

MOD = "dev.example.modelserver"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "modelserver"
NODE_SOURCE = {"query": "services", "params": {"node_id": "$node", "service": "model"}}


def upstream_module(tmp_path: Path) -> Path:
    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    page = mod / "ui" / "pages" / "overview.json"
    doc = json.loads(page.read_text())
    doc["body"].append({"type": "section", "id": "links", "title": "Links", "children": [
        {"type": "link", "id": "to-page", "text": "this page", "to": {"page": "overview"}},
        {"type": "link", "id": "to-tab", "text": "health tab", "to": {"tab": "health"}},
        {"type": "link", "id": "to-job", "text": "job 7", "to": {"job": 7}},
        {"type": "link", "id": "to-url", "text": "runbook",
         "to": {"url": "https://example.org/runbook"}},
        {"type": "link", "id": "to-node", "text": "node-a", "to": {"node": "node-a"}},
    ]})
    page.write_text(json.dumps(doc))
    (mod / "ui" / "panels" / "node.json").write_text(json.dumps({
        "ui_contract": "1.2", "title": "Model service on this node",
        "body": [{"type": "kv", "id": "details", "requires": "1.2", "source": NODE_SOURCE,
                  "items": [{"label": "state", "field": "state", "type": "status"},
                            {"label": "jobs using it", "field": "users", "type": "integer"},
                            {"label": "served by", "value": "oarbank"},
                            {"key": "health"}]}]}))
    return mod


def test_a_page_in_upstream_forms(start_portal, browser_page, screenshot,  # type: ignore[no-untyped-def]
                                  make_heartbeat, make_row, tmp_path: Path) -> None:
    mod = upstream_module(tmp_path)
    done = subprocess.run([sys.executable, "-m", "oarbank_sdk", "check", str(mod)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout  # the checker accepts what the portal shows
    p = start_portal(mod, refresh_s=0.5)
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=2)))
    page = browser_page.page
    page.goto(f"{p.url}/modules/{MOD}/pages/overview")
    links = page.locator('[data-id="links"]')
    expect(links.locator('[data-id="to-page"] a')).to_have_attribute(
        "href", f"/modules/{MOD}/pages/overview")
    expect(links.locator('[data-id="to-url"] a')).to_have_attribute(
        "href", "https://example.org/runbook")
    expect(links.locator('[data-id="to-node"] a')).to_have_attribute(
        "href", f"/nodes/node-a/modules/{MOD}/panels/node")
    for cid, text in (("to-tab", "health tab"), ("to-job", "job 7")):
        comp = links.locator(f'[data-id="{cid}"]')
        expect(comp).to_have_text(text)
        assert comp.locator("a").count() == 0  # text, not a broken link
    assert "this portal has no page for tab health" in (
        links.locator('[data-id="to-tab"] span').get_attribute("title") or "")
    screenshot(page, "upstream-forms-links")

    # Following the node target lands on the panel, whose kv mixes both item forms.
    links.locator('[data-id="to-node"] a').click()
    dl = page.locator('[data-id="details"] dl')
    expect(dl.locator("dt")).to_have_text(["state", "jobs using it", "served by", "health"])
    expect(dl.locator("dd")).to_have_text(["ready", "2", "oarbank", "healthy"])
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=5)))
    expect(dl.locator("dd").nth(1)).to_have_text("5")  # refreshed from JSON, field items
    expect(dl.locator("dd").nth(2)).to_have_text("oarbank")  # the literal stays
    screenshot(page, "upstream-forms-panel")
    assert browser_page.console_errors == [] and browser_page.dialogs == []
