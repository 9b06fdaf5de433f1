"""The reference module's charts and stats in headless Chromium against a real portal, and a
module page that tries to run script (every way a page can carry it) rendering inert.

The portal's history is a day long; a test cannot wait a day, so the samples of the hours
before it are written into the portal's store (its own tables, as the store would have
written them), and the reports of now go through ``POST /v1/heartbeat`` like an agent's."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from oarbank_ui.store.heartbeats import open_store

pytestmark = pytest.mark.browser

MOD = "dev.example.modelserver"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "modelserver"
GiB = 1024 ** 3


def seed_day(db: Path, now: float) -> None:
    """A day of samples for three nodes: node-a loads, idles out, loads again, is yielded and
    comes back; node-b runs the afternoon; node-c has never run the model."""
    store = open_store(db)
    rows = []
    try:
        # as the portal keeps them: hourly samples before the last 6 hours, then 5-minute ones
        buckets = [(float(int((now - h * 3600) // 3600) * 3600), 3600, float(h))
                   for h in range(24, 6, -1)]
        buckets += [(float(int((now - a * 300) // 300) * 300), 300, a / 12)
                    for a in range(6 * 12, 0, -1)]
        for t, res, hour in buckets:
            for node, up in (("node-a", not 14 < hour < 18 and not 2.0 < hour < 2.5),
                             ("node-b", 6 < hour < 16), ("node-c", False)):
                age = int(hour * 12)
                users = (age // 7) % 4 if up else 0
                rows.append((MOD, node, "model", res, t, f"host-{node}", int(up), int(up),
                             users, int(6.2 * GiB) if up else None, None,
                             int((18 + (age % 30) / 10) * GiB) + (int(6.2 * GiB) if up else 0),
                             8 * GiB if up else 0, None, 30))
        with store.backend.write() as tx:
            tx.many("INSERT INTO node_samples (module, node_id, service, res_s, t, hostname,"
                    " running, ready, users, rss_bytes, loads, mem_used_bytes,"
                    " mem_reserved_bytes, gpu_mem_used_bytes, samples) VALUES"
                    " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    finally:
        store.close()


def test_overview_stats_and_ready_nodes_over_a_day(start_portal, browser_page, screenshot,  # type: ignore[no-untyped-def]
                                                   make_heartbeat, make_row) -> None:
    p = start_portal(refresh_s=0.5)
    metrics = {"mem_used_bytes": 24 * GiB, "mem_reserved_bytes": 8 * GiB,
               "mem_total_bytes": 64 * GiB, "gpu_mem_used_bytes": 5 * GiB,
               "gpu_mem_total_bytes": 24 * GiB}
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=2, rss_bytes=6 * GiB, loads=3),
                                    hostname="gpu-01") | {"metrics": metrics})
    p.post_heartbeat(make_heartbeat("node-b", make_row(running=False, ready=False),
                                    hostname="gpu-02"))
    p.post_heartbeat(make_heartbeat("node-c", make_row(ready=False, users=1), hostname="gpu-03"))
    seed_day(Path(p.db), time.time())
    page = browser_page.page
    page.goto(f"{p.url}/modules/{MOD}/pages/overview")
    stats = page.locator('[data-id="counts"] .stat')
    expect(stats.locator(".label")).to_have_text(["nodes ready", "nodes starting",
                                                  "nodes stopped"])
    expect(stats.locator(".data")).to_have_text(["1", "1", "1"])
    chart = page.locator('[data-id="ready-over-time"]')
    svg = chart.locator("svg.chart-svg")
    expect(svg).to_have_attribute("role", "img")
    assert (svg.locator("title").text_content() or "").startswith(
        "Nodes whose model service was ready")
    expect(chart.locator("figcaption")).to_contain_text("over the last day")
    assert svg.locator("polyline.series").count() >= 2  # nodes ready, jobs: one line each
    # the nodes-ready line's highest point is 2 (node-a and node-b in the afternoon)
    cells = chart.locator("details.chart-data tbody tr td:nth-child(2)").all_text_contents()
    assert max(int(c) for c in cells) == 2 and 80 <= len(cells) <= 91  # 18 hours + 72
    expect(page.locator('[data-id="services"] tbody tr td a').first).to_have_attribute(
        "href", f"/nodes/node-a/modules/{MOD}/panels/node")  # node_ref cells link
    screenshot(page, "charts-overview")
    # a live change: the stat row follows without a reload
    page.evaluate("window.__same = true")
    p.post_heartbeat(make_heartbeat("node-b", make_row(users=1), hostname="gpu-02"))
    expect(stats.locator(".data")).to_have_text(["2", "1", "0"])
    assert page.evaluate("window.__same") is True
    assert browser_page.dialogs == [] and browser_page.console_errors == []


def test_node_panel_charts_of_a_day(start_portal, browser_page, screenshot,  # type: ignore[no-untyped-def]
                                    make_heartbeat, make_row) -> None:
    p = start_portal(refresh_s=0.5)
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=3, rss_bytes=6 * GiB),
                                    hostname="gpu-01")
                     | {"metrics": {"mem_used_bytes": 25 * GiB, "mem_reserved_bytes": 8 * GiB}})
    seed_day(Path(p.db), time.time())
    page = browser_page.page
    page.goto(f"{p.url}/nodes/node-a/modules/{MOD}/panels/node")
    expect(page.locator('[data-id="offline"]')).to_have_count(0)  # online: when hides it
    expect(page.locator('[data-id="memory"] dd')).to_have_text(
        ["25.0 GiB", "8.0 GiB", "6.0 GiB", ""])
    for cid in ("state-day", "users-day", "memory-day"):
        fig = page.locator(f'[data-id="{cid}"]')
        expect(fig.locator("svg.chart-svg")).to_have_attribute("role", "img")
        assert fig.locator("figcaption").inner_text()
    state = page.locator('[data-id="state-day"] svg polyline.series.s0')
    assert state.count() == 1
    bars = page.locator('[data-id="users-day"] svg rect.bar')
    assert bars.count() > 30  # a bar per 5-minute bucket of the last 6 hours that had users
    # node-a's memory line has gaps where the model was not loaded: several runs
    assert page.locator('[data-id="memory-day"] svg polyline.series.s0').count() >= 2
    screenshot(page, "charts-node-panel")
    # stale (3 periods of 0.5 s without a report): `when` shows the callout on the next draw
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=3), hostname="gpu-01")
                     | {"heartbeat_s": 0.5})
    time.sleep(2)
    page.reload()
    expect(page.locator('[data-id="offline"]')).to_contain_text("not reporting")
    expect(page.locator('[data-id="state"] .badge')).to_have_text("unknown")
    assert browser_page.dialogs == [] and browser_page.console_errors == []


def test_table_paging_and_sorting_are_links(start_portal, browser_page, screenshot,  # type: ignore[no-untyped-def]
                                            make_heartbeat, make_row, tmp_path: Path) -> None:
    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    page_file = mod / "ui" / "pages" / "overview.json"
    doc = json.loads(page_file.read_text())
    table = next(c for c in doc["body"] if c.get("id") == "services")
    table["page_size"] = 5
    page_file.write_text(json.dumps(doc))
    p = start_portal(mod, refresh_s=0.5)
    for i in range(12):
        p.post_heartbeat(make_heartbeat(f"node-{i:02d}", make_row(users=i % 5)))
    page = browser_page.page
    page.goto(f"{p.url}/modules/{MOD}/pages/overview")
    first_col = page.locator('[data-id="services"] tbody tr td:first-child')
    expect(first_col).to_have_text([f"node-{i:02d}" for i in range(5)])
    expect(page.locator('[data-id="services"] .pager')).to_contain_text("page 1 of 3")
    page.locator('[data-id="services"] .pager a[rel="next"]').click()
    expect(first_col).to_have_text([f"node-{i:02d}" for i in range(5, 10)])
    page.locator('[data-id="services"] th[data-key="users"] a').click()
    expect(page.locator('[data-id="services"] th[data-key="users"]')).to_have_attribute(
        "aria-sort", "ascending")
    users = page.locator('[data-id="services"] tbody tr td:nth-child(7)')
    expect(users).to_have_text(["0", "0", "0", "1", "1"])
    page.locator('[data-id="services"] th[data-key="users"] a').click()
    expect(users).to_have_text(["4", "4", "3", "3", "2"])
    # the refresh keeps the sorted page: a change shows in place
    p.post_heartbeat(make_heartbeat("node-04", make_row(users=9)))
    expect(users.first).to_have_text("9")
    screenshot(page, "table-sorted-paged")
    assert browser_page.dialogs == [] and browser_page.console_errors == []


HOSTILE = {"ui_contract": "1.2", "title": "<script>alert('title')</script>", "body": [
    {"type": "markdown", "id": "md", "text":
     "<script>alert('md')</script> <img src=x onerror=alert('img')>\n\n"
     "[click](javascript:alert('js')) [data](data:text/html,<script>alert(1)</script>) "
     "[ok](page:overview) [vb](vbscript:msgbox(1))"},
    {"type": "link", "id": "jslink", "text": "js", "to": "javascript:alert('link')"},
    {"type": "link", "id": "jsurl", "text": "js2", "to": {"url": "javascript:alert(2)"}},
    {"type": "chart", "id": "chart", "kind": "bar", "source": {"query": "services"},
     "x": "hostname", "y": ["users"], "summary": "<script>alert('summary')</script>",
     "labels": ["</text><script>alert('label')</script>"]},
    {"type": "callout", "id": "callout", "text": "<iframe src=javascript:alert(3)>"},
    {"type": "json", "id": "json", "source": {"query": "services"}},
    {"type": "table", "id": "tbl", "source": {"query": "services"},
     "columns": [{"key": "hostname", "label": "<b onmouseover=alert(4)>h</b>"},
                 {"key": "error"}]},
    {"type": "iframe", "id": "frame", "view": "x", "title": "<script>alert(5)</script>"},
    {"type": "text", "text": "x", "when": "node.online == '<script>alert(6)</script>'"}]}


def test_a_page_trying_to_run_script_renders_inert(start_portal, browser_page, screenshot,  # type: ignore[no-untyped-def]
                                                   make_heartbeat, make_row,
                                                   tmp_path: Path) -> None:
    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    (mod / "ui" / "pages" / "overview.json").write_text(json.dumps(HOSTILE))
    p = start_portal(mod, refresh_s=0.5)
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=2, error="<script>alert(7)</script>"),
                                    hostname="<svg onload=alert(8)>"))
    page = browser_page.page
    page.goto(f"{p.url}/modules/{MOD}/pages/overview")
    expect(page.locator('[data-id="md"]')).to_contain_text("<script>alert('md')</script>")
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    assert not [h for h in hrefs if not h.startswith(("/", "?", "#", "https://"))], hrefs
    assert f"/modules/{MOD}/pages/overview" in hrefs  # the typed link that resolves
    # the only scripts are the portal's own
    srcs = page.eval_on_selector_all("script", "els => els.map(e => e.getAttribute('src'))")
    assert srcs == ["/static/portal.js"]
    assert page.locator("iframe, img, object, embed").count() == 0
    handlers = page.evaluate("""() => [...document.querySelectorAll('*')].flatMap(
        e => [...e.attributes].filter(a => a.name.startsWith('on')).map(a => a.name))""")
    assert handlers == []
    for text in ("js", "js2"):
        assert page.get_by_text(text, exact=True).first.evaluate("e => e.tagName") == "SPAN"
    page.get_by_text("click", exact=True).click()  # a javascript: link is text: nothing runs
    page.wait_for_timeout(1200)  # two refreshes redraw the data parts with textContent only
    screenshot(page, "hostile-page-inert")
    assert browser_page.dialogs == []
    assert browser_page.console_errors == []
