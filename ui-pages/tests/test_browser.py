"""The portal's pages in headless Chromium (Debian's), driven by Playwright.

Heartbeats are posted by the test here (in the shape agents send); real agents reporting to the
portal are in test_browser_agents.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser

MOD = "dev.example.modelserver"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "modelserver"
XSS = "<img src=x onerror=alert(1)>"
HEADERS = ["node", "host", "service", "state", "health", "why stopped", "jobs using it", "error",
           "last report"]


def test_overview_table_and_a_live_change(start_portal, browser_page, read_table, screenshot,  # type: ignore[no-untyped-def]
                                          make_heartbeat, make_row) -> None:
    p = start_portal(refresh_s=0.5)
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=2), hostname="gpu-01"))
    p.post_heartbeat(make_heartbeat("node-b", make_row(running=False, ready=False),
                                    hostname="gpu-02"))
    page = browser_page.page
    page.goto(f"{p.url}/modules/{MOD}/pages/overview")
    assert page.locator('[data-id="services"] thead th').all_inner_texts() == HEADERS
    cells = read_table(page)
    assert [row[:8] for row in cells] == [
        ["node-a", "gpu-01", "model", "ready", "healthy", "", "2", ""],
        ["node-b", "gpu-02", "model", "stopped", "healthy", "idle", "0", ""],
    ]
    assert cells[0][8].endswith("ago") or cells[0][8] == "just now"
    screenshot(page, "overview-before")

    # Mark this document: after the change it must be the same one (no reload happened).
    page.evaluate("window.__sameDocument = true")
    p.post_heartbeat(make_heartbeat("node-b", make_row(running=True, ready=False, users=1),
                                    hostname="gpu-02"))
    state_b = page.locator('[data-id="services"] tbody tr').nth(1).locator("td").nth(3)
    expect(state_b).to_have_text("starting")
    assert page.evaluate("window.__sameDocument") is True
    assert read_table(page)[1][:7] == ["node-b", "gpu-02", "model", "starting", "healthy", "",
                                       "1"]
    # A third node appears as a new row, still without a reload.
    p.post_heartbeat(make_heartbeat("node-c", make_row(running=False, ready=False,
                                                       held="preempt_memory")))
    expect(page.locator('[data-id="services"] tbody tr')).to_have_count(3)
    assert read_table(page)[2][5] == "held: preempt_memory"
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "overview-after-change")
    assert browser_page.dialogs == [] and browser_page.console_errors == []


def test_script_in_an_error_shows_as_text(start_portal, browser_page, read_table, screenshot,  # type: ignore[no-untyped-def]
                                          make_heartbeat, make_row) -> None:
    p = start_portal(refresh_s=0.5)
    p.post_heartbeat(make_heartbeat("node-x", make_row(running=False, ready=False, error=XSS),
                                    hostname=XSS))
    page = browser_page.page
    page.goto(f"{p.url}/modules/{MOD}/pages/overview")
    error_cell = page.locator('[data-id="services"] tbody tr').first.locator("td").nth(7)
    assert error_cell.inner_text() == XSS
    # And again once the page's script has redrawn the table from JSON.
    refreshed = page.locator("#refresh-state")
    first = refreshed.inner_text()
    expect(refreshed).not_to_have_text(first)
    assert read_table(page)[0][1] == XSS and read_table(page)[0][7] == XSS
    assert page.locator("main img").count() == 0
    page.wait_for_timeout(300)  # give a would-be onerror handler time to fire
    assert browser_page.dialogs == []
    screenshot(page, "overview-escaped-error")


def test_unknown_and_newer_components_are_placeholders(start_portal, browser_page, read_table,  # type: ignore[no-untyped-def]
                                                       screenshot, make_heartbeat, make_row,
                                                       tmp_path: Path) -> None:
    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    page_file = mod / "ui" / "pages" / "overview.json"
    doc = json.loads(page_file.read_text())
    doc["body"][1:1] = [
        {"type": "sparkline", "id": "future", "source": {"query": "services"}},
        {"type": "table", "id": "newer", "requires": "1.9", "source": {"query": "services"},
         "columns": [{"key": "node_id"}]},
        {"type": "chart", "fallback": "drop"},
        {"type": "table", "id": "broken", "source": {"query": "no_such_query"},
         "columns": [{"key": "x"}]},
    ]
    page_file.write_text(json.dumps(doc))
    p = start_portal(mod, refresh_s=0.5)
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=1)))
    page = browser_page.page
    page.goto(f"{p.url}/modules/{MOD}/pages/overview")
    placeholders = page.locator(".placeholder").all_inner_texts()
    assert placeholders == ["not supported by this console version", "needs UI contract 1.9"]
    expect(page.locator('[data-id="broken"] .unavailable')).to_have_text("data unavailable")
    expect(page.locator('[data-id="broken"] .unavailable')).to_be_visible()
    assert read_table(page)[0][:4] == ["node-a", "host-node-a", "model", "ready"]  # the rest
    assert page.locator(".component.text").first.is_visible()
    screenshot(page, "overview-placeholders")
    assert browser_page.console_errors == []


def test_node_panel(start_portal, browser_page, screenshot, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    p = start_portal(refresh_s=0.5)
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=2)))
    page = browser_page.page
    page.goto(f"{p.url}/")
    page.get_by_role("link", name="modelserver: Model service on this node").click()
    expect(page.locator('[data-id="state"] .data')).to_have_text("ready")
    dl = page.locator('[data-id="details"] dl')
    labels = dl.locator("dt").all_inner_texts()
    values = dl.locator("dd").all_inner_texts()
    kv = dict(zip(labels, values, strict=True))
    assert kv["jobs using it"] == "2" and kv["endpoint"] == "yes" and kv["health"] == "healthy"
    p.post_heartbeat(make_heartbeat("node-a", make_row(running=False, ready=False,
                                                       withdrawn=True, error="start failed 5x")))
    expect(page.locator('[data-id="state"] .data')).to_have_text("stopped")
    expect(dl.locator("dd").nth(1)).to_have_text("withdrawn")
    screenshot(page, "node-panel")
