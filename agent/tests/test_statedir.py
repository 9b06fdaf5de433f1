"""The state dir is the agent's alone: 0700 and 0600 for everything it writes, another user's
folder refused, one agent at a time (a second one exits 2 naming the first's pid and leaves
its control socket alone). Real agents, real files, real locks."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from oarbank_agent.operate import control


def run_second(state_dir: Path, module: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_agent", "run", "--state-dir",
                           str(state_dir), "--module", str(module), "--node-id", "second"],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def loose(root: Path) -> list[str]:
    """Everything under ``root`` (itself included) that group or others may access."""
    found = []
    for p in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(os.lstat(p).st_mode)
        if stat.S_ISLNK(os.lstat(p).st_mode):
            continue
        if mode & 0o077:
            found.append(f"{oct(mode)} {p.relative_to(root.parent)}")
    return found


def test_everything_the_agent_writes_is_its_own(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module], settings={"echo": {"greeting": "hi"}})
    job = agent.run_job("echo", {"prompts": ["a"]})  # a service, a runner, an attempt's files
    sd = agent.state_dir
    assert stat.S_IMODE(os.stat(sd).st_mode) == 0o700
    # the files the contract names, each written by the agent, all there and 0600
    mod = sd / "modules" / "test.agent.echo"
    jobdir = sd / "jobs" / job["job_id"]
    for f in (sd / "agent.lock", sd / "control.sock", sd / "limits.json", sd / "tools.json",
              mod / "settings.json", jobdir / "job.json", jobdir / "a1" / "spec.json",
              jobdir / "a1" / "runner.log"):
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f
    # and nothing at all under the state dir is open to group or others (what the children
    # wrote included: they inherit the agent's umask)
    assert loose(sd) == []
    assert (sd / "agent.lock").read_text().strip() == str(agent.pid)


def test_a_second_agent_on_the_same_state_dir_exits_2_naming_the_first(
        start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module])
    agent.run_job("echo", {"prompts": ["a"]})
    assert agent.service_row()["ready"] is True  # its service runs, with its process group
    sock = agent.state_dir / "control.sock"
    inode = os.stat(sock).st_ino
    r = run_second(agent.state_dir, echo_module)
    assert r.returncode == 2, r
    assert f"another agent (pid {agent.pid}) is running on the state dir" in r.stderr
    assert str(agent.state_dir / "agent.lock") in r.stderr
    assert "ready" not in r.stdout
    # the first agent's socket is the same file and it still answers
    assert os.stat(sock).st_ino == inode
    assert control.request(agent.state_dir, {"op": "status"})["ok"] is True
    assert agent.service_row()["ready"] is True  # the second agent ended nothing of it
    assert agent.run_job("echo", {"prompts": ["b"]})["attempts"] == 1  # and it still runs jobs


def test_a_loose_state_dir_of_ours_is_tightened(start_agent, echo_module: Path,
                                                 tmp_path: Path) -> None:
    sd = tmp_path / "loose"
    sd.mkdir(mode=0o755)
    os.chmod(sd, 0o755)
    agent = start_agent([echo_module], state_dir=sd)
    assert stat.S_IMODE(os.stat(agent.state_dir).st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_a_state_dir_owned_by_another_user_is_refused(tmp_path: Path, echo_module: Path) -> None:
    sd = tmp_path / "theirs"
    sd.mkdir(mode=0o700)
    os.chown(sd, 65534, 65534)  # nobody
    r = run_second(sd, echo_module)
    assert r.returncode == 2, r
    assert (f"oarbank-agent: --state-dir: the state dir {sd} belongs to uid 65534") in r.stderr
    assert "not to this agent's user (uid 0" in r.stderr
    assert list(sd.iterdir()) == []  # nothing written into it
    assert stat.S_IMODE(os.stat(sd).st_mode) == 0o700 and os.stat(sd).st_uid == 65534
