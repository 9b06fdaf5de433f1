"""A service whose fingerprint ``reserve`` the agent cannot account (an unknown unit, a
negative amount) refuses its module at load, naming the service and the key: at agent start
and at ``module add``. Real agents and real fingerprint ops; the other module runs on."""

from __future__ import annotations

import json
from pathlib import Path

from agent_helpers import write_module

from oarbank_agent.operate import control

GOOD, BAD = "test.agent.echo", "test.agent.costly"


def test_an_unknown_reserve_unit_refuses_the_module_at_start(start_agent, tmp_path: Path) -> None:
    good = write_module(tmp_path / "good")
    bad = write_module(tmp_path / "bad", module_id=BAD)
    agent = start_agent([good, bad], {BAD: {"reserve": {"mem_tb": 1}}})
    why = ("service echo: fingerprint: reserve.mem_tb: unknown unit (this agent knows mem_gb, "
           "gpu_mem_gb)")
    st = agent.status()
    assert st["modules_refused"] == {BAD: f"{BAD} ({bad}): cannot run on this node: {why}"}
    assert [r["module"] for r in st["services"]] == [GOOD]  # no row of the refused one
    reply = control.request(agent.state_dir, {"op": "submit", "module": BAD, "stage": "echo",
                                              "payload": {}})
    assert not reply["ok"] and reply["code"] == "unknown_module", reply
    assert f"module '{BAD}' was refused when the agent started" in reply["error"]
    assert "reserve.mem_tb: unknown unit" in reply["error"]
    assert f"module refused: {BAD} ({bad}): cannot run on this node: {why}" in agent.log()
    # nothing is left queued for it, and the other module is unharmed
    assert [j["module"] for j in st["jobs"]] == []
    assert agent.run_job("echo", {"requests": 1})["state"] == "succeeded"


def test_module_add_refuses_a_negative_reserve_and_keeps_nothing(start_agent,
                                                                 tmp_path: Path) -> None:
    agent = start_agent([write_module(tmp_path / "good")])
    sd = str(agent.state_dir)
    bad = write_module(tmp_path / "bad", module_id=BAD)
    # `module add` keeps a module's settings file: the one its service reads
    (agent.state_dir / "modules" / BAD).mkdir(parents=True)
    (agent.state_dir / "modules" / BAD / "settings.json").write_text(
        json.dumps({"reserve": {"mem_gb": -1}}))
    r = agent.cli("module", "add", "--state-dir", sd, str(bad))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert (f"module add: {BAD} ({bad}): cannot run on this node: service echo: fingerprint: "
            "reserve.mem_gb: must be a number >= 0 (GB), got -1") in r.stderr, r.stderr
    listed = agent.cli("module", "list", "--state-dir", sd)
    assert listed.returncode == 0, listed.stderr
    assert f"{BAD}  refused  {BAD} ({bad}): cannot run on this node: service echo:" in \
        listed.stdout and f"{BAD}  enabled" not in listed.stdout, listed.stdout
    st = agent.status()
    assert BAD in st["modules_refused"] and [r["module"] for r in st["services"]] == [GOOD]
    assert not (agent.state_dir / "modules.json").exists() or str(bad) not in json.loads(
        (agent.state_dir / "modules.json").read_text()).get("added", [])
    # fixed, the same folder is added and runs
    (agent.state_dir / "modules" / BAD / "settings.json").write_text(
        json.dumps({"reserve": {"mem_gb": 0.1}}))
    r = agent.cli("module", "add", "--state-dir", sd, str(bad))
    assert r.returncode == 0, r.stderr
    assert BAD not in agent.status()["modules_refused"]
    assert agent.run_job("echo", {"requests": 1}, module=BAD)["state"] == "succeeded"
