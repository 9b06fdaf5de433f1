"""A real agent reporting to a real portal (`oarbank-portal serve`, a token issued by its CLI):
the node's figures for node_exporter (--metrics-textfile), and a refused report logged once
and shown in `status`."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import PORTAL, RunningAgent, running_portal, write_module

from oarbank_agent.reporting.heartbeat import HeartbeatSender
from testsupport.senders import until_answered


@pytest.fixture
def portal(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with running_portal(tmp_path) as p:
        yield p


def portal_cli(*args: str, db: Path) -> str:
    r = subprocess.run([*PORTAL, *args, "--db", str(db)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def samples(text: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"(?m)^(oarbank_agent_[^ ]+) (\S+)$", text)}


def wait_for(cond: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_textfile_and_refusals(tmp_path: Path, portal: dict[str, Any]) -> None:
    mod = write_module(tmp_path / "mod")
    token = tmp_path / "portal.token"
    token.touch(mode=0o600)
    token.write_text(portal_cli("token", "issue", "test-node", db=portal["db"]) + "\n")
    prom = tmp_path / "textfile" / "oarbank.prom"
    prom.parent.mkdir()
    agent = RunningAgent(tmp_path / "a", [mod], {}, extra_args=[
        "--portal", portal["url"], "--portal-token-file", str(token), "--heartbeat-s", "0.3",
        "--metrics-textfile", str(prom)])
    try:
        job = agent.submit("echo", {"text": "hi"})
        assert agent.wait(job)["state"] == "succeeded"
        node = 'node_id="test-node"'
        wait_for(lambda: prom.exists() and samples(prom.read_text()).get(
            f'oarbank_agent_jobs{{{node},state="succeeded"}}') == 1)
        figures = samples(prom.read_text())
        assert figures[f"oarbank_agent_attempts_total{{{node}}}"] == 1
        assert figures[f'oarbank_agent_services{{module="test.agent.echo",{node},'
                       'state="ready"}'] == 1
        assert figures[f'oarbank_agent_heartbeat_posts_total{{{node},result="ok"}}'] >= 1
        assert prom.stat().st_mode & 0o777 == 0o644  # node_exporter runs as another user
        assert list(prom.parent.iterdir()) == [prom]  # no temp file left beside it
        hb = agent.status()["heartbeat"]
        assert hb["token"] is True and hb["refused"] == [] and hb["posts_ok"] >= 1

        # The operator revokes the node's token: refused, logged once, shown in status.
        portal_cli("token", "revoke", "test-node", db=portal["db"])
        wait_for(lambda: any(r["count"] >= 3 for r in agent.status()["heartbeat"]["refused"]))
        (cause,) = agent.status()["heartbeat"]["refused"]
        assert cause["cause"] == ("HTTP 401: heartbeat: the token is not one this portal "
                                  "issued, or it was revoked")
        assert agent.log().count("refused this node's report") == 1
        wait_for(lambda: samples(prom.read_text()).get(
            f"oarbank_agent_heartbeat_refused_total{{{node}}}", 0) >= 3)
    finally:
        agent.stop()
    # the last figures: the agent stopped its service
    figures = samples(prom.read_text())
    assert figures[f'oarbank_agent_services{{module="test.agent.echo",{node},'
                   'state="stopped"}'] == 1


def test_a_service_error_with_nul_reaches_the_portal(tmp_path: Path,
                                                      portal: dict[str, Any]) -> None:
    # a service's error may carry whatever its process wrote; the portal refuses NUL (its
    # PostgreSQL store cannot hold one): the agent sends each as U+FFFD, and the node stays
    # reported
    token = portal_cli("token", "issue", "nul-node", db=portal["db"])
    row = {"module": "dev.example.nul", "service": "model", "health": "unhealthy",
           "running": False, "ready": False, "accepting": False,
           "error": "start exited with 1: weights\x00missing", "held": None,
           "disabled": False, "withdrawn": False, "gpu_api_missing": False,
           "lifecycle": "on_demand", "users": 0, "endpoint": True}

    def report() -> dict[str, Any]:
        return {"node_id": "nul-node", "hostname": "nul-host", "time": time.time(),
                "services": [dict(row)]}

    sender = asyncio.run(until_answered(
        HeartbeatSender(portal["url"], report, period_s=0.2, token=token), 2, 30))
    assert sender.posts_ok >= 2 and sender.posts_failed == 0, sender.status()
    with contextlib.closing(sqlite3.connect(portal["db"])) as db:  # sqlite3's `with` only commits
        (stored,) = db.execute("SELECT error FROM service_rows WHERE node_id = 'nul-node'")
    assert stored == ("start exited with 1: weights\ufffdmissing",)
