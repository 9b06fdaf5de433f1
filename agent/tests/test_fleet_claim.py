"""Fleet dispatch, the node's side (contract section 10): real agents (``run --claim``) pull
jobs from a real portal (``oarbank-portal serve``, SQLite) and run them with examples/
modelserver; every job here is submitted to the portal only, and its result is read back
from the portal, as a submitter would.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_helpers import PORTAL, RunningAgent, running_portal

from oarbank_agent.operate.demo import find_example

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ui-pages" / "tests"))
from dispatch_helpers import call, submitter_token  # noqa: E402  (ui-pages' test helpers)

EXAMPLE = find_example()
MODULE = "dev.example.modelserver"


def complete(prompt: str) -> str:
    """What examples/modelserver's stand-in model answers (model_service.complete)."""
    return f"{prompt[::-1]} [{hashlib.sha256(prompt.encode()).hexdigest()[:8]}]"


def node_token(tmp_path: Path, db: Path, node_id: str) -> Path:
    path = tmp_path / f"{node_id}.token"
    if path.exists():
        return path
    token = subprocess.run([*PORTAL, "token", "issue", node_id, "--db", str(db)],
                           capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    return path


def claiming_agent(tmp_path: Path, portal: dict[str, Any], node_id: str,
                   settings: dict[str, Any] | None = None,
                   extra: list[str] | None = None) -> RunningAgent:
    token = node_token(tmp_path, portal["db"], node_id)
    return RunningAgent(tmp_path / node_id, [EXAMPLE],
                        {"modelserver": settings or {"load_s": 0.3, "slots": 2}},
                        extra_args=["--node-id", node_id, "--portal", portal["url"],
                                    "--portal-token-file", str(token), "--heartbeat-s", "1",
                                    "--claim", "--claim-wait-s", "2", *(extra or [])])


def submit(portal: dict[str, Any], token: str, prompts: list[list[str]],
           **payload: Any) -> list[str]:
    r = call(portal["url"], "POST", "/v1/jobs", {"jobs": [
        {"module": MODULE, "stage": "generate", "payload": {"prompts": p, **payload}}
        for p in prompts]}, token=token)
    assert r.status == 201, r.text
    return [j["job_id"] for j in r.doc["jobs"]]


def job(portal: dict[str, Any], token: str, job_id: str) -> dict[str, Any]:
    r = call(portal["url"], "GET", f"/v1/jobs/{job_id}", token=token)
    assert r.status == 200, r.text
    return r.doc


def wait_jobs(portal: dict[str, Any], token: str, ids: list[str], timeout: float = 90,
              done: Callable[[dict[str, Any]], bool] = lambda j: j["state"] in (
                  "succeeded", "failed", "cancelled")) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        jobs = [job(portal, token, i) for i in ids]
        if all(done(j) for j in jobs):
            return jobs
        assert time.monotonic() < deadline, [(j["job_id"], j["state"], j["node_id"])
                                             for j in jobs]
        time.sleep(0.2)


def loads(agent: RunningAgent) -> int:
    f = agent.module_data(MODULE) / "model.loads"
    return sum(1 for line in f.read_text().splitlines() if line.strip()) if f.exists() else 0


def test_portal_jobs_run_on_the_agent_and_their_results_come_back(tmp_path: Path) -> None:
    with running_portal(tmp_path, "--module", str(EXAMPLE)) as portal:
        sub = submitter_token(portal["db"], "alice")
        agent = claiming_agent(tmp_path, portal, "n1")
        try:
            prompts = [[f"job {i}", "hello"] for i in range(6)]
            ids = submit(portal, sub, prompts)
            # A local job beside them: `submit` on the node still works, and the portal
            # never hears of it.
            local = agent.run_job("generate", {"prompts": ["local"]}, module="modelserver")
            assert local["state"] == "succeeded", agent.why(local)
            assert local["result"]["payload"]["texts"] == [complete("local")]
            jobs = wait_jobs(portal, sub, ids)
            for j, p in zip(jobs, prompts, strict=True):
                assert j["state"] == "succeeded", j
                assert j["node_id"] == "n1" and j["grants"] == 1 and j["generation"] == 1
                assert j["result"]["payload"]["texts"] == [complete(t) for t in p]
                assert j["record"]["state"] == "succeeded" and j["record"]["attempts"] == 1
            st = agent.status()
            by_portal = {r["portal"]["job_id"]: r for r in st["jobs"] if r["portal"]}
            assert sorted(by_portal) == sorted(ids)
            assert {r["job_id"] for r in st["jobs"] if not r["portal"]} == {local["job_id"]}
            assert all(r["portal"]["report"] == "accepted" for r in by_portal.values())
            # each portal job's record is the local one, under the local id
            assert {j["record"]["job_id"] for j in jobs} == {r["job_id"]
                                                            for r in by_portal.values()}
            fleet = st["fleet"]
            assert fleet["results"]["accepted"] == 6 and fleet["results"]["owed"] == 0
            # a job's end frees room: the claim that follows carries its result
            assert fleet["results"]["carried"] >= 1, fleet["results"]
            assert fleet["leases"]["held"] == 0 and fleet["leases"]["lost"] == 0
            assert loads(agent) == 1  # one warm model served all seven
        finally:
            agent.stop()


def offers(portal: dict[str, Any], node_id: str) -> list[dict[str, Any]]:
    """The node's latest claim as the portal keeps it for placement (its claim_offers rows)."""
    with contextlib.closing(sqlite3.connect(portal["db"])) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute(
            "SELECT * FROM claim_offers WHERE node_id = ? ORDER BY module, service",
            (node_id,))]


def wait_until(cond: Callable[[], Any], timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what or cond}"
        time.sleep(0.1)


def test_the_warm_node_gets_the_jobs(tmp_path: Path) -> None:
    with running_portal(tmp_path, "--module", str(EXAMPLE)) as portal:
        sub = submitter_token(portal["db"], "alice")
        # a 5 s load: the 8 jobs' wait on the warm copy (8 x a job's time / 2 tokens) is
        # shorter, so no second copy is worth starting (the cold node reads the warm node's
        # measured load; with a 0.3 s one a slow machine's backlog would start a copy)
        slow_load = {"load_s": 5.0, "slots": 2}
        warm = claiming_agent(tmp_path, portal, "warm", slow_load)
        cold = None
        try:
            # warm: its model loaded by a local job; its claim says so
            assert warm.run_job("generate", {"prompts": ["x"]},
                                module="modelserver")["state"] == "succeeded"
            wait_until(lambda: [o["state"] for o in offers(portal, "warm")] == ["ready"],
                       what="the warm node's claim saying ready")
            cold = claiming_agent(tmp_path, portal, "cold", slow_load)
            wait_until(lambda: [o["state"] for o in offers(portal, "cold")] == ["stopped"],
                       what="the cold node's claim")
            (w,), (c,) = offers(portal, "warm"), offers(portal, "cold")
            # what the claims carried is each node's real state: the warm node's measured
            # load (the stand-in model loads in 5 s) and job time, its free tokens
            assert w["tokens"] == 2 and 5.0 <= w["load_s"] < 30 and w["job_s"] > 0, w
            assert c["tokens"] == 2 and c["load_s"] is None and c["job_s"] is None, c
            ids = submit(portal, sub, [[f"p{i}"] for i in range(8)])
            jobs = wait_jobs(portal, sub, ids)
            assert [(j["state"], j["node_id"], j["placement"]) for j in jobs] == [
                ("succeeded", "warm", "ready")] * 8
            assert loads(warm) == 1 and loads(cold) == 0
            assert cold.status()["fleet"]["claims"]["granted"] == 0
        finally:
            warm.stop()
            if cold is not None:
                cold.stop()


def test_an_agent_killed_holding_leases_its_jobs_complete_once_on_the_other(
        tmp_path: Path) -> None:
    with running_portal(tmp_path, "--module", str(EXAMPLE), "--lease-s", "3") as portal:
        sub = submitter_token(portal["db"], "alice")
        killed = claiming_agent(tmp_path, portal, "k")
        other = again = None
        try:
            prompts = [["slow a"], ["slow b"]]
            ids = submit(portal, sub, prompts, hold_s=5)
            killed.wait_for(lambda: [j["state"] for j in killed.status()["jobs"]] == [
                "running"] * 2, what="both attempts running on k")
            assert {j["node_id"] for j in wait_jobs(portal, sub, ids, done=lambda j: True)} == {
                "k"}
            killed.kill()  # -9, holding both leases; its runners die with it (fate sharing)
            # the other node, warm (a local job loads its model): its claims say ready
            other = claiming_agent(tmp_path, portal, "o")
            assert other.run_job("generate", {"prompts": ["x"]},
                                 module="modelserver")["state"] == "succeeded"
            jobs = wait_jobs(portal, sub, ids)
            for j, p in zip(jobs, prompts, strict=True):
                # requeued at the lease's expiry, without charge; completed once, on o
                assert (j["state"], j["node_id"], j["generation"], j["grants"],
                        j["lease_expiries"]) == ("succeeded", "o", 2, 2, 1), j
                assert j["result"]["payload"]["texts"] == [complete(t) for t in p]
                assert j["record"]["attempts"] == 1
            # k again, on its state dir: its records hold both grants; the renew says they
            # are lost, so they end there, cancelled, not run to the end and not reported
            again = claiming_agent(tmp_path, portal, "k")
            again.wait_for(lambda: [j["state"] for j in again.status()["jobs"]] == [
                "cancelled"] * 2, what="k's two lost jobs cancelled")
            rows = again.status()["jobs"]
            assert all(r["portal"]["report"].startswith("lost: ") for r in rows), rows
            assert all(r["reason"] in ("portal: lease_lost", "portal: stale_generation")
                       for r in rows), rows
            assert again.status()["fleet"]["results"]["accepted"] == 0
            # the portal's records stand: o's results, one completion each
            assert [(j["state"], j["node_id"], j["grants"])
                    for j in wait_jobs(portal, sub, ids)] == [("succeeded", "o", 2)] * 2
            assert other.status()["fleet"]["results"]["accepted"] == 2
        finally:
            killed.stop()
            for a in (other, again):
                if a is not None:
                    a.stop()


def test_a_job_its_submitter_cancels_is_ended_on_the_node_and_not_reported(
        tmp_path: Path) -> None:
    with running_portal(tmp_path, "--module", str(EXAMPLE), "--lease-s", "3") as portal:
        sub = submitter_token(portal["db"], "alice")
        agent = claiming_agent(tmp_path, portal, "n1")
        try:
            (jid,) = submit(portal, sub, [["long"]], hold_s=60)
            agent.wait_for(lambda: [j["state"] for j in agent.status()["jobs"]] == ["running"],
                           what="the attempt running")
            t0 = time.monotonic()
            r = call(portal["url"], "POST", f"/v1/jobs/{jid}/cancel", {}, token=sub)
            assert r.status == 200 and r.doc["state"] == "cancelled", r.text
            # the next renew (every second here) says so: the runner is ended, far before
            # its 60 s, and the node reports nothing
            agent.wait_for(lambda: [j["state"] for j in agent.status()["jobs"]] == [
                "cancelled"], timeout=15, what="the local attempt cancelled")
            assert time.monotonic() - t0 < 15
            (row,) = agent.status()["jobs"]
            assert row["reason"] == "portal: cancelled" and row["portal"]["report"] == (
                "lost: cancelled")
            st = agent.status()["fleet"]
            assert st["leases"]["lost"] == 1 and st["results"] == {
                "owed": 0, "accepted": 0, "carried": 0, "refused": {}, "retries": 0,
                "last_error": None}
            assert job(portal, sub, jid)["state"] == "cancelled"
            assert "long"[::-1] not in json.dumps(job(portal, sub, jid))  # no result came
        finally:
            agent.stop()


def test_a_stopping_agent_hands_back_what_its_drain_did_not_finish(tmp_path: Path) -> None:
    # a lease far longer than the test: only the hand-back can queue the job again in time
    with running_portal(tmp_path, "--module", str(EXAMPLE), "--lease-s", "300") as portal:
        sub = submitter_token(portal["db"], "alice")
        stopping = claiming_agent(tmp_path, portal, "s", extra=["--drain-s", "1"])
        other = again = None
        try:
            (jid,) = submit(portal, sub, [["slow"]], hold_s=6)
            stopping.wait_for(lambda: [j["state"] for j in stopping.status()["jobs"]] == [
                "running"], what="the attempt running on s")
            stopping.stop()  # SIGTERM: its 1 s drain does not see the 6 s job to its end
            # handed back before the agent exited: queued again at once, without charge
            j = job(portal, sub, jid)
            assert (j["state"], j["grants"], j["lease_expiries"]) == ("queued", 1, 0), j
            assert "portal job(s) the drain did not finish handed back" in stopping.log()
            # another node runs it: its second grant, a lease early
            other = claiming_agent(tmp_path, portal, "o")
            (done,) = wait_jobs(portal, sub, [jid])
            assert (done["state"], done["node_id"], done["generation"], done["grants"],
                    done["lease_expiries"]) == ("succeeded", "o", 2, 2, 0), done
            assert done["result"]["payload"]["texts"] == [complete("slow")]
            # s again, on its state dir: the job it handed back ended there, cancelled; it is
            # neither run again nor renewed nor reported
            again = claiming_agent(tmp_path, portal, "s")
            (row,) = again.status()["jobs"]
            assert row["state"] == "cancelled" and row["portal"]["report"].startswith(
                "released: "), row
            assert row["reason"] == f"portal: {row['portal']['report']}", row
            fleet = again.status()["fleet"]
            assert fleet["leases"]["held"] == 0 and fleet["results"]["accepted"] == 0, fleet
            assert job(portal, sub, jid)["node_id"] == "o"
        finally:
            stopping.stop()
            for a in (other, again):
                if a is not None:
                    a.stop()
