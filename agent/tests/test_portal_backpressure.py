"""A real agent against a real portal whose store cannot keep up (another client holds its
write lock): the portal answers 503 with Retry-After, the agent waits that long (plus jitter)
instead of posting every period, then sends its whole snapshot; once the portal offers it,
the agent's unchanged reports go as short still-alives that keep the node fresh."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import PORTAL, RunningAgent, running_portal, write_module

RETRY_AFTER_S = 2


@pytest.fixture
def portal(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with running_portal(tmp_path, "--ingest-bound-s", "0.3",
                        "--retry-after-s", str(RETRY_AFTER_S)) as p:
        yield p


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:  # noqa: S310 - loopback
        m = re.search("^" + re.escape(name) + r" (\S+)$", r.read().decode(), re.M)
    return float(m.group(1)) if m else 0.0


def wait_for(cond: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_the_agent_waits_as_asked_then_reports_whole(tmp_path: Path,
                                                     portal: dict[str, Any]) -> None:
    mod = write_module(tmp_path / "mod")
    token = tmp_path / "portal.token"
    token.touch(mode=0o600)
    issued = subprocess.run([*PORTAL, "token", "issue", "test-node", "--db", str(portal["db"])],
                            capture_output=True, text=True, timeout=60, check=True)
    token.write_text(issued.stdout.strip() + "\n")
    agent = RunningAgent(tmp_path / "a", [mod], {}, extra_args=[
        "--portal", portal["url"], "--portal-token-file", str(token), "--heartbeat-s", "0.3"])
    url = portal["url"]
    refused = "oarbank_portal_reports_refused_total{cause=\"overloaded\"}"
    try:
        # unchanged reports become still-alives once the portal has offered them
        wait_for(lambda: metric(url, "oarbank_portal_reports_still_alive_total") >= 2)
        held = sqlite3.connect(str(portal["db"]), isolation_level=None, timeout=5)
        try:
            held.execute("BEGIN IMMEDIATE")  # the portal's writes wait from here
            wait_for(lambda: agent.status()["heartbeat"]["deferred"] >= 1, timeout=10)
            t0 = time.monotonic()
            before = metric(url, refused.replace("{", "\\{"))
            time.sleep(3.0)  # the input: a 3 s outage, over which refusals are counted
            during = metric(url, refused.replace("{", "\\{")) - before
            elapsed = time.monotonic() - t0
        finally:
            held.execute("ROLLBACK")
            held.close()
        # at its 0.3 s period (and retries) the agent would have posted ~10 times; asked to
        # wait 2-3 s, it came back at most twice
        assert during <= elapsed / RETRY_AFTER_S + 1, f"{during} refused in {elapsed:.1f} s"
        assert "HTTP 503" in agent.log() and "(Retry-After)" in agent.log()
        # the store is back: the whole snapshot is stored, then still-alives again
        alive = metric(url, "oarbank_portal_reports_still_alive_total")
        accepted = metric(url, "oarbank_portal_reports_accepted_total")
        wait_for(lambda: metric(url, "oarbank_portal_reports_accepted_total") > accepted + 2)
        wait_for(lambda: metric(url, "oarbank_portal_reports_still_alive_total") > alive)
        with urllib.request.urlopen(  # noqa: S310 - loopback
                url + "/v1/queries/services?module=test.agent.echo", timeout=10) as r:
            body = r.read().decode()
        # fresh (a stale node's rows answer "unknown"), its on-demand service idle
        assert '"node_id": "test-node"' in body and '"stopped_reason": "idle"' in body, body
    finally:
        agent.stop()
