"""The fleet bench's faults part, run for real (quick, SQLite): a real portal and three real
agents; an agent killed with -9 holding leases and started again after they expired, another
stopped (SIGTERM) holding leases and started again at once, the portal killed with -9 and
started again. What a user of the fleet checks: no job lost, none completed twice, every
result the fences refused is one the run's figures account for, and a stopped agent leaves
no job waiting for its lease to expire."""

from __future__ import annotations

import pytest

from harness.bench.fleet import table
from harness.bench.fleetfaults import run_fleet_faults

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("fleet-faults")]


def test_faults_lose_no_job_and_complete_none_twice() -> None:
    out = run_fleet_faults(quick=True, stores=("sqlite",))
    f = out["stores"]["sqlite"]
    assert "error" not in f, f
    assert f["jobs"] == out["jobs"] and f["states"] == {"succeeded": out["jobs"]}, f
    assert f["jobs_lost"] == 0 and f["jobs_completed_twice"] == 0, f
    # the faults happened, in order: the agent's kill and restart, the portal's
    events = " | ".join(f["events"])
    assert "node-0 killed with -9 holding" in events and "portal killed with -9" in events
    assert events.index("node-1 stopped (SIGTERM") < events.index("node-0 started again") \
        < events.index("portal killed")
    # the stopped agent handed back what its drain did not finish: the portal leased it
    # nothing once it had exited
    assert f["leased_to_the_stopped_agent_after_it_exited"] == 0, f["events"]
    # work repeated only where an attempt was cut short: a lease that expired while the
    # killed node was down, or a job the stopped node handed back (its drain ended the run)
    assert f["work_done_twice_of_no_cut_attempt"] == 0, f
    assert f["done_lines_of_no_record"] == 0, f
    rows = table({"faults": out})
    assert "| faults, sqlite (3 agents, 120 jobs) | jobs lost | 0 | | | 0 | met |" in rows
    assert "| | jobs still leased to the stopped agent once it exited | 0 | | | 0 | met |" in rows
