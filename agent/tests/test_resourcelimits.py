"""Resources as limits (issue 15, part 5; G4): a stage's requires.resources.mem_gb and cpu
become its attempt cgroup's memory.max and cpu.max; an attempt the OOM killer ended fails as
the job fault `oom` naming the limit; where the controller is missing the agent says so (one
line at start, `status.resource_limits`).

The pure parts need no kernel. The controller chain is checked on a directory tree shaped
like cgroupfs (a fake: this host offers no memory or cpu controller to its cgroup v2 tree).
The real limit runs where the agent reports it enforced; on this host it does not, and
`harness/e2e/scenarios/oom_limit.py` proves it on a backend with a full cgroup v2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agent_helpers import write_module

from oarbank_agent.platform.linux import limits as cglimits
from oarbank_agent.sandbox import resourcelimits as rl

# A memory.events file as the kernel writes it (Linux 6.x), after one OOM kill.
MEMORY_EVENTS = "low 0\nhigh 0\nmax 37\noom 1\noom_kill 1\noom_group_kill 0\n"


def test_limit_values_from_the_manifest() -> None:
    assert rl.stage_limits(0.5, 1.5) == {"memory.max": str(512 << 20),
                                         "cpu.max": "150000 100000"}
    assert rl.stage_limits(2, None) == {"memory.max": str(2 << 30)}
    assert rl.stage_limits(None, 0.25) == {"cpu.max": "25000 100000"}
    assert rl.stage_limits(None, 0.001) == {"cpu.max": "1000 100000"}  # the kernel's minimum
    assert rl.stage_limits(None, None) == {}
    only_cpu = rl.Limits({"memory": "not offered"})
    assert only_cpu.files_for(0.5, 2) == {"cpu.max": "200000 100000"}
    assert rl.Limits({}).files_for(0.5, None) == {"memory.max": str(512 << 20)}


def test_oom_is_read_from_memory_events() -> None:
    assert cglimits.oom_kills(MEMORY_EVENTS) == 1
    assert cglimits.oom_kills("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 3\n") == 0
    assert cglimits.oom_kills("") == 0
    assert rl.oom_reason(0.125, 1) == (
        "oom: the OOM killer ended 1 process(es) of the attempt at its memory limit, "
        "requires.resources.mem_gb = 0.125 (memory.max = 134217728 bytes)")


def test_oom_fault_reads_the_attempts_cgroup_file(tmp_path: Path) -> None:
    from oarbank_agent.platform.linux.groups import LinuxGroup

    group = LinuxGroup(os.getpid(), cgroup=tmp_path)
    (tmp_path / "memory.events").write_text(MEMORY_EVENTS)
    assert rl.oom_fault(group, 0.125) == rl.oom_reason(0.125, 1)
    (tmp_path / "memory.events").write_text(MEMORY_EVENTS.replace("oom_kill 1", "oom_kill 0"))
    assert rl.oom_fault(group, 0.125) is None
    assert rl.oom_fault(LinuxGroup(os.getpid(), cgroup=tmp_path / "gone"), 0.125) is None
    assert rl.oom_fault(None, 1) is None and rl.oom_fault(LinuxGroup(os.getpid()), 1) is None


def _tree(root: Path, offered: str, enabled: str = "") -> Path:
    """<root> (the agent's cgroup) / oarbank / <hash>: the base, files as in cgroupfs."""
    base = root / "oarbank" / "abc"
    base.mkdir(parents=True)
    for d in (root, root / "oarbank", base):
        (d / "cgroup.controllers").write_text(offered + "\n")
        (d / "cgroup.subtree_control").write_text(enabled + "\n")
    return base


def test_controllers_enabled_down_the_chain_or_said_missing(tmp_path: Path) -> None:
    base = _tree(tmp_path / "full", "cpu memory pids")
    limits = rl.Limits(cglimits.setup(base, ""))
    assert limits.missing == {}
    assert (base / "cgroup.subtree_control").read_text() == "+cpu"  # (the fake keeps the last)
    hybrid = _tree(tmp_path / "hybrid", "hugetlb")
    limits = rl.Limits(cglimits.setup(hybrid, ""))
    assert limits.missing["memory"] == (f"the memory controller is not offered to "
                                        f"{tmp_path / 'hybrid'} (its cgroup.controllers: "
                                        "hugetlb)")
    assert limits.report()["memory.max"] == {"state": "unavailable",
                                             "why": limits.missing["memory"]}
    assert limits.line().startswith("resource limits: memory.max (requires.resources.mem_gb) "
                                    "unavailable: the memory controller is not offered")
    none = rl.Limits(cglimits.setup(None, "cgroups not usable here: no cgroup v2 file system "
                                          "is mounted"))
    assert none.report()["cpu.max"]["why"] == (
        "no cgroup for each attempt here (cgroups not usable here: no cgroup v2 file system "
        "is mounted)")


def test_the_agent_says_which_limits_it_enforces_and_enforces_them(start_agent,
                                                                  tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", stages=[
        {"name": "small", "timeout_s": 120, "retry": {"max_attempts": 3},
         "requires": {"resources": {"mem_gb": 0.125, "cpu": 0.5}}}])
    agent = start_agent([mod])
    report = agent.status()["resource_limits"]
    lines = [ln for ln in agent.log().splitlines() if "resource limits: " in ln]
    assert len(lines) == 1, lines
    for name in ("memory.max", "cpu.max"):
        state = report[name]["state"]
        assert state in ("enforced", "unavailable")
        assert f"{name} (" in lines[0]
        if state == "unavailable":  # said, with why: never a silent no-op
            assert report[name]["why"] and report[name]["why"] in lines[0]
            # ... and a WARNING for the stage that asks for it (none for a limit nobody asks)
            key = {"memory.max": "mem_gb = 0.125", "cpu.max": "cpu = 0.5"}[name]
            warned = [ln for ln in agent.log().splitlines() if "WARNING" in ln
                      and f"stage small: requires.resources.{key} is not enforced" in ln]
            assert len(warned) == 1 and report[name]["why"] in warned[0], agent.log()
    assert agent.run_job("small", {"alloc_mb": 16})["state"] == "succeeded"
    if report["memory.max"]["state"] != "enforced":
        pytest.skip(f"this kernel gives the agent no memory controller "
                    f"({report['memory.max']['why']}): harness/e2e/scenarios/oom_limit.py proves "
                    "the limit on a backend with a full cgroup v2")
    job = agent.run_job("small", {"alloc_mb": 512})
    assert (job["state"], job["attempts"]) == ("failed", 1), job  # a job fault: not retried
    assert job["reason"].startswith("oom: the OOM killer ended"), job
    assert "at its memory limit, requires.resources.mem_gb = 0.125" in job["reason"]


def test_the_agent_moves_only_itself_out_of_its_cgroup(tmp_path: Path) -> None:
    """cgroup v2: a non-root cgroup that gives controllers to its children holds no process;
    the agent's own (a systemd unit's, delegated) is emptied into <own>/agent first, but only
    of the agent's processes. (A directory shaped like cgroupfs: no kernel rule runs here.)"""
    own = tmp_path / "unit"
    own.mkdir()
    (own / "cgroup.type").write_text("domain\n")
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    assert cglimits._make_room(own) is None
    assert (own / "agent" / "cgroup.procs").read_text() == str(os.getpid())
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n1\n")  # init is not the agent's
    assert cglimits._make_room(own) == (
        f"the agent's cgroup {own} also holds processes that are not the agent's (1): run the "
        "agent in a cgroup of its own (systemd: its unit, with Delegate=yes)")
    (own / "cgroup.type").unlink()  # the root cgroup may keep its processes
    assert cglimits._make_room(own) is None
