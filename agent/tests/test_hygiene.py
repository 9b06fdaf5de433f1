"""Hygiene at scale through a real agent: 10,000 connects across 200 jobs. Afterwards the
agent's open descriptors and threads are back to their baseline, no process is left in any
group it started (only the warm service's own), and its memory has not grown."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agent_helpers import processes_referencing, read_jsonl, write_module

from testsupport.privilege import AGENT_UNDUMPABLE, require_root

JOBS = 200
CONNECTS_PER_JOB = 50


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            out[key] = int(value.split()[0])
    require_root(AGENT_UNDUMPABLE)
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def settled(agent: Any) -> dict[str, int]:
    """The agent's counts once they hold still for a moment."""
    last: dict[str, int] = {}
    for _ in range(100):
        now = proc_status(agent.pid)
        if last and now["fds"] == last["fds"] and now["Threads"] == last["Threads"]:
            return now
        last = now
        time.sleep(0.2)
    return last


def test_ten_thousand_connects_leave_nothing_behind(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"idle_timeout_s": 600})
    agent = start_agent([mod], {"echo": {"slots": 8}})
    # Warm up (service up, first-use allocations done), then the baseline.
    warm = [agent.submit("echo", {"requests": CONNECTS_PER_JOB}) for _ in range(8)]
    assert all(agent.wait(j)["state"] == "succeeded" for j in warm)
    before = settled(agent)
    t0 = time.monotonic()
    ids = [agent.submit("echo", {"requests": CONNECTS_PER_JOB}) for _ in range(JOBS)]
    recs = [agent.wait(j, 600) for j in ids]
    wall = time.monotonic() - t0
    assert [r["state"] for r in recs].count("succeeded") == JOBS, \
        [r for r in recs if r["state"] != "succeeded"][:3]
    assert sum(len(r["result"]["payload"]["pids"]) for r in recs) == JOBS * CONNECTS_PER_JOB
    # Back to the baseline: a leak never returns; an op the agent runs on its own (fingerprint
    # refresh, list_owned after an attempt) holds a few descriptors only while it runs.
    agent.wait_for(lambda: proc_status(agent.pid)["fds"] <= before["fds"]
                   and proc_status(agent.pid)["Threads"] <= before["Threads"], timeout=30,
                   what=f"the agent's descriptors and threads back to {before}")
    after = settled(agent)
    print(f"\n{JOBS * CONNECTS_PER_JOB} connects over {JOBS} jobs in {wall:.1f}s; agent "
          f"before: {before['fds']} fds, {before['Threads']} threads, RSS {before['VmRSS']} kB; "
          f"after: {after['fds']} fds, {after['Threads']} threads, RSS {after['VmRSS']} kB")
    assert after["fds"] <= before["fds"], (before, after)
    assert after["Threads"] <= before["Threads"], (before, after)
    # Memory does not grow with the work: job records stay in memory (status lists them), a
    # few kB each, so allow that and allocator noise, far below what a per-connect leak of
    # even 1 kB (10 MB) would show.
    assert after["VmRSS"] - before["VmRSS"] < 6 * 1024, (before, after)
    # Every service ended each attempt's connections (`ended` reached it for all 200).
    ended = [e for e in read_jsonl(agent.module_data() / "events.jsonl") if e["event"] == "ended"]
    assert len({e["attempt"] for e in ended}) == JOBS + len(warm)
    # No runner and no op left: only the warm service's daemon (and no group record but its).
    def left() -> list[str]:  # the agent and its watcher name its state dir
        return [p for p in processes_referencing(agent.root)
                if int(p.split(":")[0]) not in (agent.pid, agent.watcher_pid())]

    daemon = [e["pid"] for e in read_jsonl(agent.module_data() / "events.jsonl")
              if e["event"] == "daemon"]
    def records() -> list[str]:
        return sorted(p.name for p in (agent.state_dir / "procs").glob("*.json"))

    # The agent's own periodic ops (fingerprint refresh, list_owned after an attempt) may be
    # running at this moment: they end on their own, and the agent drops an ended group's
    # record just after its last process is reaped; what stays is only the daemon's.
    agent.wait_for(lambda: [int(p.split(":")[0]) for p in left()] == daemon
                   and len(records()) == 1, timeout=30,
                   what=f"only the daemon {daemon} left: {left()}, one group record: {records()}")
