"""Containment: the end of an attempt reaches a runner's child that left the attempt's process
group (setsid), when cgroup v2 is usable (each attempt in a cgroup of its own); a `kill -9`
restart ends what the predecessor left in its cgroups, recorded or not. Each test says which
containment mode ran (`status`: containment)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from agent_helpers import MODFILES, alive, runner_file, write_module

from oarbank_agent.sandbox import containment


def setsid_module(root: Path) -> Path:
    mod = write_module(root, runner={"exec": ["python", "-I", "{bundle}/setsid_runner.py"],
                                     "stop_grace_s": 1},
                       stages=[{"name": "plain", "timeout_s": 60}], with_service=False)
    shutil.copy(MODFILES / "setsid_runner.py", mod / "setsid_runner.py")
    return mod


def need_cgroups(agent) -> dict:  # type: ignore[no-untyped-def]
    st = agent.status()
    print(f"containment: {st['containment']} ({st['containment_note']})")
    if st["containment"] != "cgroup":
        pytest.skip(f"cgroup containment is not usable on this machine: "
                    f"{st['containment_note']}")
    return st


def escapee(agent, attempt_id: str) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(runner_file(agent, attempt_id, f"escapee-{attempt_id}.json").read_text())


def test_a_setsid_grandchild_of_the_runner_is_gone_after_the_attempt(start_agent,
                                                                     tmp_path: Path) -> None:
    agent = start_agent([setsid_module(tmp_path / "m")])
    st = need_cgroups(agent)
    base = Path(st["containment_base"])
    rec = agent.run_job("plain", {})
    assert rec["state"] == "succeeded", rec
    esc = rec["result"]["payload"]["escapee"]
    try:
        # It really had left the runner's group and session...
        assert esc["pgid"] != esc["runner_pgid"] and esc["sid"] != esc["runner_pgid"], esc
        # ...and the attempt's end reached it all the same.
        assert not alive(esc["pid"]), f"the setsid'd grandchild {esc['pid']} outlived the attempt"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(esc["pid"], signal.SIGKILL)
    # The attempt's cgroup is gone with it (only the agent's base remains).
    assert not [p for p in base.iterdir() if p.is_dir()], list(base.iterdir())


def test_kill_9_restart_ends_the_predecessors_cgroups_even_unrecorded(start_agent,
                                                                      tmp_path: Path) -> None:
    mod = setsid_module(tmp_path / "m")
    first = start_agent([mod])
    need_cgroups(first)
    job_id = first.submit("plain", {"hold_s": 60})
    info = runner_file(first, f"{job_id}.1", f"escapee-{job_id}.1.json")
    first.wait_for(info.exists, timeout=30, what="the first attempt's escapee")
    esc = escapee(first, f"{job_id}.1")
    try:
        first.kill_with_watcher()  # the runner and its escapee stay behind
        assert alive(esc["pid"])
        # The crash lost the records too: only the cgroups under the agent's base remain
        # to find the runner and its escapee by.
        for rec in (first.state_dir / "procs").glob("*.json"):
            rec.unlink()
        second = start_agent([mod], state_dir=first.state_dir)
        assert second.status()["containment"] == "cgroup"
        assert not alive(esc["pid"]), "the predecessor's escapee survived the restart"
        assert "left by a previous agent" in second.log()
        rec = second.wait(job_id, timeout=60)  # requeued without charge, then done
        assert rec["state"] == "succeeded", rec
        assert not alive(rec["result"]["payload"]["escapee"]["pid"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(esc["pid"], signal.SIGKILL)


def test_containment_process_group_mode_says_so(start_agent, tmp_path: Path) -> None:
    agent = start_agent([write_module(tmp_path / "m")],
                        extra_args=["--containment", "process-group"])
    st = agent.status()
    assert (st["containment"], st["containment_base"]) == ("process-group", None), st
    assert "--containment process-group" in st["containment_note"]
    assert agent.run_job("plain", {})["state"] == "succeeded"


def test_unknown_containment_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown containment 'jail'"):
        containment.resolve("jail", tmp_path)


@pytest.mark.parametrize(("line", "fast"), [
    ("41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,favordynmods", True),
    ("41 31 0:38 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot",
     False),
    ("30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory,favordynmods", False),
])
def test_favordynmods_read_from_the_cgroup2_super_options(line: str, fast: bool) -> None:
    from oarbank_agent.platform.linux import cgroups
    assert cgroups.favors_dynmods(line + "\n") is fast


def test_status_says_whether_cgroup_moves_are_cheap_here(start_agent, tmp_path: Path) -> None:
    from oarbank_agent.platform.linux import cgroups
    agent = start_agent([write_module(tmp_path / "m")])
    st = need_cgroups(agent)
    fast = cgroups.favors_dynmods(Path("/proc/self/mountinfo").read_text())
    assert ("without favordynmods" not in st["containment_note"]) is fast, st
    assert "favordynmods" in st["containment_note"], st
