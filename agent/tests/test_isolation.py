"""Isolation through a real agent: a job gets connectors only to endpoint services of its own
module whose pools its stage reserves; `needs_pools` gives none; a connect after the attempt
ended fails; every descriptor the agent creates is close-on-exec except in the one child meant
to inherit it (checked in /proc of runners, ops, service daemons and the agent itself)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from agent_helpers import MODFILES, read_jsonl, runner_file, write_module

from testsupport.privilege import AGENT_UNDUMPABLE, require_root

O_CLOEXEC = 0o2000000


def fault_module(root: Path, **kw: Any) -> Path:
    mod = write_module(root, runner={"exec": ["python", "-I", "{bundle}/fault_runner.py"]}, **kw)
    shutil.copy(MODFILES / "fault_runner.py", mod / "fault_runner.py")
    return mod


def stdio_ok(fds: dict[str, str]) -> bool:
    return fds.get("0") == "/dev/null" and {"1", "2"} <= set(fds)


def test_connectors_only_to_own_reserved_endpoint_services(start_agent, tmp_path: Path) -> None:
    stages = [{"name": "echo", "timeout_s": 30, "requires": {"pools": {"echo": 1}}},
              {"name": "needs", "timeout_s": 30, "requires": {"needs_pools": ["echo"]}},
              {"name": "plain", "timeout_s": 30}]
    a = fault_module(tmp_path / "a", module_id="test.agent.alpha", stages=stages)
    b = fault_module(tmp_path / "b", module_id="test.agent.beta", stages=stages)
    agent = start_agent([a, b])
    ids = {(m, st): agent.submit(st, {"mode": "fds", "ask": st == "echo"}, module=m)
           for m in ("test.agent.alpha", "test.agent.beta") for st in ("echo", "needs", "plain")}
    recs = {k: agent.wait(j) for k, j in ids.items()}
    assert all(r["state"] == "succeeded" for r in recs.values()), recs
    data = {m: agent.state_dir / "modules" / m / "data" for m in ("test.agent.alpha",
                                                                 "test.agent.beta")}
    for (module, stage), rec in recs.items():
        fds = rec["result"]["payload"]["fds"]
        spec = json.loads((agent.state_dir / "jobs" / rec["job_id"] / "a1" / "spec.json")
                          .read_text())
        env_has = rec["result"]["payload"]["services"] == ["OARBANK_SERVICE_ECHO"]
        assert env_has or rec["result"]["payload"]["services"] == []
        extra = {fd: what for fd, what in fds.items() if fd not in ("0", "1", "2")}
        assert stdio_ok(fds), fds
        if stage == "echo":
            # Exactly one inherited descriptor: its connector, a socket.
            assert env_has and len(extra) == 1, (module, stage, fds)
            assert next(iter(extra.values())).startswith("socket:"), fds
            # ... and it reaches its own module's service only.
            own = {e["pid"] for e in read_jsonl(data[module] / "events.jsonl")
                   if e["event"] == "hello"}
            assert rec["result"]["payload"]["pid"] in own
        else:
            assert not env_has and extra == {}, (module, stage, fds)
        assert spec["attempt_id"] == f"{rec['job_id']}.1"
    for module, d in data.items():
        conns = [e["attempt"] for e in read_jsonl(d / "events.jsonl")
                 if e["event"] == "connection"]
        assert conns == [agent.wire_attempt(ids[(module, "echo")])], (module, conns)


def test_connect_after_the_attempt_ended_fails(start_agent, tmp_path: Path) -> None:
    # Process-group containment: a child that left the runner's group survives the attempt
    # (cgroup containment would end it, see test_containment), so it can try its old
    # connector, which the agent must have closed.
    agent = start_agent([fault_module(tmp_path / "m")],
                        extra_args=["--containment", "process-group"])
    rec = agent.run_job("echo", {"mode": "escape"})
    assert rec["state"] == "succeeded" and rec["result"]["payload"]["escaped"], rec
    out = runner_file(agent, f"{rec['job_id']}.1", f"escape-{rec['job_id']}.1.json")
    agent.wait_for(out.exists, timeout=20, what="the escaped child's report")
    report = json.loads(out.read_text())
    assert report["connected"] is False, report
    assert report["code"] in ("closed", "oserror"), report  # the agent closed it


def test_no_descriptor_leaks_into_children_and_the_agent_sets_cloexec(start_agent,
                                                                      tmp_path: Path) -> None:
    agent = start_agent([fault_module(tmp_path / "m")], {"echo": {"slots": 6}})
    # Six attempts at once: connectors of one must never reach another.
    ids = [agent.submit("echo", {"mode": "fds", "ask": True}) for _ in range(6)]
    for j in ids:
        rec = agent.wait(j)
        fds = rec["result"]["payload"]["fds"]
        extra = {fd: what for fd, what in fds.items() if fd not in ("0", "1", "2")}
        assert stdio_ok(fds) and len(extra) == 1, fds
    events = read_jsonl(agent.module_data() / "events.jsonl")
    for e in events:
        if e["event"] == "op":
            extra = {fd: w for fd, w in e["fds"].items() if fd not in ("0", "1", "2")}
            # Only `start` inherits one descriptor, the endpoint channel.
            if e["op"] == "start":
                assert len(extra) == 1 and next(iter(extra.values())).startswith("socket:"), e
                assert "OARBANK_ENDPOINT_CHANNEL" in e["env"]
            else:
                assert extra == {}, e
                assert "OARBANK_ENDPOINT_CHANNEL" not in e["env"]
        if e["event"] == "daemon":
            extra = {fd: w for fd, w in e["fds"].items() if fd not in ("0", "1", "2")}
            assert len(extra) == 1, e  # the channel `start` passed on, nothing of the agent's
    # The agent's own descriptors (beyond stdio) are all close-on-exec.
    require_root(AGENT_UNDUMPABLE)
    not_cloexec = []
    for fd in os.listdir(f"/proc/{agent.pid}/fdinfo"):
        if int(fd) <= 2:
            continue
        try:
            info = (Path(f"/proc/{agent.pid}/fdinfo") / fd).read_text()
            target = os.readlink(f"/proc/{agent.pid}/fd/{fd}")
        except OSError:
            continue
        flags = int(next(line.split()[1] for line in info.splitlines()
                         if line.startswith("flags:")), 8)
        if not flags & O_CLOEXEC:
            not_cloexec.append(f"{fd} -> {target}")
    assert not not_cloexec, not_cloexec
