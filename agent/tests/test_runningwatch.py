"""Running services stay known (issue 15, part 4; G8): a running service is fingerprinted
again every --refresh-s and right after it becomes ready; its pool count changes admission at
once. Real agents; the echo service's fingerprint reads its slots from the node settings."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import read_jsonl, write_module

from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services import runningwatch

MOD = "test.agent.echo"


def set_slots(agent: Any, slots: int) -> None:
    path = agent.state_dir / "modules" / MOD / "settings.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"slots": slots}))
    tmp.replace(path)


def ops(agent: Any) -> list[dict[str, Any]]:
    return [e for e in read_jsonl(agent.module_data() / "events.jsonl") if e["event"] == "op"]


def job(agent: Any, job_id: str) -> dict[str, Any]:
    return next(j for j in agent.status()["jobs"] if j["job_id"] == job_id)


def wait_fingerprints_applied(agent: Any, since: float, n: int) -> None:
    """Wait until ``n`` fingerprints begun after ``since`` (wall time) have been applied. The
    refreshes run one after the other and an op's event is written as it begins, so a
    fingerprint's answer has been applied once the next one begins: wait for ``n + 1``."""
    agent.wait_for(lambda: sum(1 for o in ops(agent) if o["op"] == "fingerprint"
                               and o["t"] > since) >= n + 1, timeout=30,
                   what=f"{n} fingerprints applied")


def test_due_is_ready_run_by_the_agent_and_idle() -> None:
    S = lc.State
    assert runningwatch.due([
        ("a", S.READY, "on_demand", False), ("b", S.READY, "always", False),
        ("c", S.READY, "manual", False),  # manualwatch's
        ("d", S.READY, "on_demand", True),  # an effect in flight fingerprints it itself
        ("e", S.STOPPED, "on_demand", False), ("f", S.BACKOFF, "always", False),
        ("g", S.STARTING, "always", False)]) == ["a", "b"]


def test_a_changed_pool_count_changes_admission_while_it_runs(start_agent,
                                                              tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"lifecycle": "always"})
    agent = start_agent([mod], {"echo": {"slots": 0}}, extra_args=["--refresh-s", "1"])
    agent.wait_for(lambda: agent.service_row()["ready"], timeout=60, what="ready")
    t_submit = time.time()
    waiting = agent.submit("echo", {})
    wait_fingerprints_applied(agent, t_submit, 2)  # two refreshes: still 0 tokens, the job waits
    assert job(agent, waiting)["state"] == "queued", job(agent, waiting)
    set_slots(agent, 2)
    t0 = time.monotonic()
    assert agent.wait(waiting, 60)["state"] == "succeeded"
    # admitted by a refresh, not by anything else: the service never restarted
    assert agent.service_row()["starts"] == 1
    assert time.monotonic() - t0 < 30
    # fewer tokens: admitted no more
    set_slots(agent, 0)
    t_set = time.time()
    # The first fingerprint begun after the change may have read its settings before it; the
    # second began after the first was over, so it read 0 tokens: wait until it is applied.
    wait_fingerprints_applied(agent, t_set, 2)
    t_submit = time.time()
    later = agent.submit("echo", {})
    wait_fingerprints_applied(agent, t_submit, 2)  # two more refreshes: the job still waits
    assert job(agent, later)["state"] == "queued", job(agent, later)
    assert job(agent, later)["reason"], job(agent, later)  # it says why it waits
    set_slots(agent, 1)
    assert agent.wait(later, 60)["state"] == "succeeded"


def test_fingerprinted_right_after_ready_and_then_every_refresh_s(start_agent,
                                                                   tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"lifecycle": "always"})
    agent = start_agent([mod], extra_args=["--refresh-s", "2"])
    agent.wait_for(lambda: agent.service_row()["ready"], timeout=60, what="ready")
    agent.wait_for(lambda: any(o["op"] == "ready" for o in ops(agent)), what="a ready op")

    def after_ready() -> list[float]:
        first_ready = min(o["t"] for o in ops(agent) if o["op"] == "ready")
        return [o["t"] for o in ops(agent) if o["op"] == "fingerprint" and o["t"] > first_ready]

    agent.wait_for(lambda: len(after_ready()) >= 1, timeout=30, what="a fingerprint after ready")
    agent.wait_for(lambda: len(after_ready()) >= 4, timeout=60, what="periodic fingerprints")
    times = after_ready()
    gaps = [b - a for a, b in itertools.pairwise(times[1:])]
    # every --refresh-s: never much sooner (a loaded machine may make them later)
    assert all(g >= 1.5 for g in gaps), times


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_refresh_s_must_be_positive(tmp_path: Path, value: str) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "oarbank_agent", "run", "--state-dir",
                        str(tmp_path / "s"), "--module", str(tmp_path), "--refresh-s", value],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"--refresh-s {value}: must be > 0" in r.stderr, r.stderr
