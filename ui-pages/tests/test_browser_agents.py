"""End to end: two real agents report to one portal; an operator's page in Chromium.

Node A runs jobs (its row: `ready`, users > 0 while they run); node B ran one job and its
service was idle-stopped (row: `stopped`, why stopped `idle`). The page is never reloaded: the
test watches its cells change. Then the portal goes down: agent A keeps running jobs, and the
open page catches up once the portal is back. Each agent reports with its own token (issued by
`oarbank-portal token issue`). Agent A frozen (SIGSTOP) goes stale on the page (`unknown`, a
warning tone); agent B stopped says so in its last report (`agent stopped`).

Real processes throughout: `oarbank-portal serve`, two `oarbank-agent run --portal`, the
example module's service and runner, Debian's Chromium. The module is a copy of
examples/modelserver with a short idle timeout and a fast model load (test settings).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "modelserver"
MOD = "dev.example.modelserver"
AGENT = [sys.executable, "-m", "oarbank_agent"]
IDLE_S = 3
HEARTBEAT_S = 1


class Agent:
    def __init__(self, root: Path, node_id: str, module: Path, settings: Path,
                 portal: str, db: str | Path) -> None:
        self.node_id = node_id
        self.state_dir = root / node_id / "state"
        self.log = root / node_id / "agent.log"
        self.log.parent.mkdir(parents=True)
        token = subprocess.run([sys.executable, "-m", "oarbank_ui.cli", "token", "issue",
                                node_id, "--db", str(db)], capture_output=True, text=True,
                               timeout=60, check=True).stdout.strip()
        token_file = root / node_id / "portal.token"
        token_file.touch(mode=0o600)
        token_file.write_text(token + "\n")
        argv = [*AGENT, "run", "--state-dir", str(self.state_dir), "--module", str(module),
                "--node-id", node_id, "--settings", f"modelserver={settings}",
                "--portal", portal, "--heartbeat-s", str(HEARTBEAT_S),
                "--portal-token-file", str(token_file)]
        with open(self.log, "wb") as errf:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errf,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready(60)

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise AssertionError(f"agent {self.node_id} not ready: {self.log.read_text()}")
            if select.select([self.proc.stdout], [], [], left)[0]:
                chunk = os.read(self.proc.stdout.fileno(), 1)
                if not chunk:
                    raise AssertionError(f"agent {self.node_id} exited: {self.log.read_text()}")
                line += chunk
        assert b"oarbank-agent: ready" in line, line

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*AGENT, *args, "--state-dir", str(self.state_dir)],
                              capture_output=True, text=True, timeout=timeout)

    def submit(self, hold_s: float, *, wait: bool = False) -> str:
        payload = json.dumps({"prompts": [f"hello from {self.node_id}"], "hold_s": hold_s})
        r = self.cli("submit", "--module", "modelserver", "--stage", "generate", "--payload",
                     payload, *(["--wait"] if wait else []))
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    def status(self) -> dict[str, Any]:
        r = self.cli("status", "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)  # type: ignore[no-any-return]

    def model_users(self) -> int:
        (row,) = [s for s in self.status()["services"] if s["service"] == "model"]
        return int(row["users"])

    def terminate(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a test may have frozen it
            os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()


def wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def module_copy(tmp_path: Path) -> tuple[Path, Path]:
    """examples/modelserver with a short idle timeout, and settings for a fast model load."""
    import shutil

    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    toml = mod / "oarbank-module.toml"
    text, n = re.subn(r"(?m)^idle_timeout_s = \d+", f"idle_timeout_s = {IDLE_S}",
                      toml.read_text())
    assert n == 1
    toml.write_text(text)
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"load_s": 0.2}))
    return mod, settings


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        a.terminate()  # all at once: they shut down in parallel
    for a in started:
        a.stop()
    # Nothing the agents started outlives them (services, runners, ops).
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(p.info["cmdline"] or [])
            # the portal belongs to start_portal, which ends it after this fixture
            if str(tmp_path) in cmdline and "oarbank_ui.cli" not in cmdline:
                left.append((p.pid, cmdline))
        except psutil.Error:
            continue
    assert left == [], f"processes left behind: {left}"


def row_cells(page: Any, node_id: str) -> Any:
    return page.locator('[data-id="services"] tbody tr', has_text=node_id).locator("td")


# Columns of examples/modelserver/ui/pages/overview.json
STATE, WHY, USERS, ERROR = 3, 5, 6, 7


def test_two_agents_on_one_portal(start_portal, browser_page, read_table, screenshot,  # type: ignore[no-untyped-def]
                                  module_copy, agents, tmp_path: Path) -> None:
    mod, settings = module_copy
    portal = start_portal(mod, refresh_s=0.5)
    a = Agent(tmp_path, "node-a", mod, settings, portal.url, portal.db)
    agents.append(a)
    b = Agent(tmp_path, "node-b", mod, settings, portal.url, portal.db)
    agents.append(b)

    page = browser_page.page
    page.goto(f"{portal.url}/modules/{MOD}/pages/overview")
    page.evaluate("window.__sameDocument = true")
    # Both nodes report; nothing has needed the on-demand service yet.
    expect(page.locator('[data-id="services"] tbody tr')).to_have_count(2)
    for node in ("node-a", "node-b"):
        expect(row_cells(page, node).nth(STATE)).to_have_text("stopped")

    # One short job on B: its service starts, then idles out. 3 s: B is ready for 3 s + IDLE_S,
    # which a page refreshed each 0.5 s from 1 s heartbeats sees even under heavy load (with
    # 1 s, a load average of 30 hid it). Three overlapping jobs on A, long enough to outlast
    # B's job + IDLE_S + a heartbeat even when A's service comes up seconds before B's.
    b.submit(hold_s=3)
    for _ in range(3):
        a.submit(hold_s=16)

    # Watched without reloading: B's service comes up for its job, A's for its three.
    # (Generous: a service start under a loaded CI machine took more than 5 s. B's stays ready
    # for its 3 s job plus IDLE_S, and the page refreshes every 0.5 s.)
    expect(row_cells(page, "node-b").nth(STATE)).to_have_text("ready", timeout=30_000)
    expect(row_cells(page, "node-a").nth(STATE)).to_have_text("ready", timeout=30_000)
    page.wait_for_function(
        """() => {
            const tr = [...document.querySelectorAll('[data-id="services"] tbody tr')]
                .find(r => r.cells[0].textContent === "node-a");
            return tr && parseInt(tr.cells[6].textContent, 10) > 0;
        }""")
    # B's job ends; IDLE_S later its service is stopped for being idle.
    expect(row_cells(page, "node-b").nth(STATE)).to_have_text("stopped", timeout=20_000)
    expect(row_cells(page, "node-b").nth(WHY)).to_have_text("idle")
    cells = {row[0]: row for row in read_table(page)}
    assert cells["node-a"][STATE] == "ready" and int(cells["node-a"][USERS]) > 0, cells
    assert cells["node-a"][WHY] == ""
    assert cells["node-b"][STATE] == "stopped" and cells["node-b"][USERS] == "0"
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "two-agents")
    # What the agents' heartbeats say about memory reaches the nodes query: the node's memory
    # and, while its model service runs, the service's resident memory and its starts.
    from oarbank_ui.queries.shape import Shaping
    from oarbank_ui.store.heartbeats import open_store

    store = open_store(portal.db)
    try:
        nodes = {r["node_id"]: r for r in store.host_query("nodes", [MOD], {}, Shaping())}
        samples = store.host_query("node_metrics", [MOD], {"node_id": "node-a"}, Shaping())
    finally:
        store.close()
    assert nodes["node-a"]["mem_total_bytes"] > nodes["node-a"]["mem_used_bytes"] > 0
    assert nodes["node-a"]["rss_bytes"] > 0 and nodes["node-b"]["rss_bytes"] is None
    assert samples and max(r["users"] for r in samples) > 0
    assert max(r["loads"] or 0 for r in samples) >= 1
    panel = browser_page.page.context.new_page()
    panel.goto(f"{portal.url}/nodes/node-a/modules/{MOD}/panels/node")
    expect(panel.locator('[data-id="memory"] dd').first).to_contain_text("B")  # a size
    expect(panel.locator('[data-id="users-day"] svg rect.bar').first).to_be_visible()
    screenshot(panel, "two-agents-node-a-panel")
    panel.close()

    # The portal goes down. Agent A keeps running jobs; the page says its data is stale.
    portal_port = portal.url.rsplit(":", 1)[1]
    portal.proc.terminate()
    assert portal.proc.wait(10) == 0
    expect(page.locator("#refresh-state")).to_have_class("stale")
    wait_for(lambda: a.model_users() == 0, 30, "A's first jobs to finish")
    done = json.loads(a.submit(hold_s=0, wait=True))
    assert done["state"] == "succeeded"
    for _ in range(2):
        a.submit(hold_s=20)
    wait_for(lambda: a.model_users() == 2, 30, "A's two new jobs to run")
    assert a.proc.poll() is None
    assert "cannot reach portal" in a.log.read_text()

    # The portal comes back (same address, same store): the open page catches up by itself.
    start_portal(mod, listen=f"127.0.0.1:{portal_port}", refresh_s=0.5)
    expect(page.locator("#refresh-state")).not_to_have_class("stale", timeout=20_000)
    expect(row_cells(page, "node-a").nth(USERS)).to_have_text("2", timeout=20_000)
    expect(row_cells(page, "node-a").nth(STATE)).to_have_text("ready")
    assert page.evaluate("window.__sameDocument") is True
    screenshot(page, "two-agents-after-portal-outage")

    # A frozen agent sends nothing: 3 of its periods later its row is `unknown`, in a warning
    # tone, and says since when.
    os.kill(a.proc.pid, signal.SIGSTOP)
    expect(row_cells(page, "node-a").nth(STATE)).to_have_text("unknown", timeout=20_000)
    expect(row_cells(page, "node-a").nth(STATE).locator(".badge")).to_have_class(
        re.compile(r"\btone-warn\b"))
    expect(row_cells(page, "node-a").nth(WHY)).to_contain_text("node not reporting (last "
                                                               "report 20")
    os.kill(a.proc.pid, signal.SIGCONT)
    expect(row_cells(page, "node-a").nth(STATE)).to_have_text("ready", timeout=20_000)
    # An agent that stops says so: its last report.
    b.stop()
    expect(row_cells(page, "node-b").nth(WHY)).to_have_text("agent stopped")
    expect(row_cells(page, "node-b").nth(STATE)).to_have_text("stopped")
    screenshot(page, "two-agents-stale-and-stopped")
    assert "refused" not in a.log.read_text()  # its token was good all along
    assert browser_page.dialogs == []
