"""The memory guard under REAL memory pressure: a child process allocates and touches memory
until the host's available memory crosses a floor set for the test.

The floors are set relative to what this machine has available when the test starts (a
fixed amount below it: 2.5-3 GiB, wide enough that parallel test workers starting agents and
browsers do not cross it by themselves), so the test allocates about the same ~3 GiB on any
machine, and the allocation is bounded by the floor so it never pushes a shared machine into
real trouble. The hog stops allocating as soon as the floor is crossed and frees everything
(in ``finally``) as soon as the agent has reacted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from agent_helpers import read_jsonl, write_module

from testsupport import memhog

# Every test that pushes the host's memory down runs in this one xdist group (also the yield
# scenario's in harness/tests): one test's hog crosses the floors another test's agent set
# relative to what was available when it started (CI: the hard-floor test's service held again
# by the soft-floor test's hog after its own hold had lifted).
pytestmark = pytest.mark.xdist_group(memhog.XDIST_GROUP)

GiB = 1 << 30
SAFETY = int(1.5 * GiB)  # the hog never takes more than available - SAFETY


class Hog:
    """memhog.py in its own process group, holding until ``free``."""

    def __init__(self, target_available: int) -> None:
        cap = psutil.virtual_memory().available - SAFETY
        assert cap > 0, "this machine has too little memory available for a pressure test"
        self.proc = subprocess.Popen(
            [sys.executable, memhog.__file__, str(target_available), str(cap)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)

    def event(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "memhog exited without a word"
        return json.loads(line)

    def free(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@contextlib.contextmanager
def hog(target_available: int) -> Iterator[Hog]:
    h = Hog(target_available)
    try:
        yield h
    finally:
        h.free()  # always give the memory back


def floor_args(soft_below: float, hard_below: float | None, margin: float) -> tuple[list[str], int]:
    """Floors a fixed number of bytes below what is available now, as fractions of total."""
    vm = psutil.virtual_memory()
    soft = (vm.available - soft_below) / vm.total
    hard = (vm.available - hard_below) / vm.total if hard_below is not None else 0.0
    args = ["--mem-soft-floor", f"{soft:.6f}", "--mem-hard-floor", f"{hard:.6f}",
            "--mem-recover-margin", f"{margin / vm.total:.6f}", "--mem-sample-s", "0.2"]
    target = int((hard if hard_below is not None else soft) * vm.total) - (16 << 20)
    return args, target


def row(agent: Any, module: str) -> dict[str, Any]:
    return next(r for r in agent.status()["services"] if r["module"] == module)


def test_hard_floor_stops_the_service_held_and_requeues_its_jobs(start_agent,
                                                                 tmp_path: Path) -> None:
    t0 = time.monotonic()
    mod = write_module(tmp_path / "m")
    args, target = floor_args(soft_below=2.5 * GiB, hard_below=3.0 * GiB, margin=0.2 * GiB)
    # The service holds 150 MiB: the largest footprint, so the hard floor's victim.
    agent = start_agent([mod], {"echo": {"ballast_mb": 150}}, extra_args=args)
    # Attempt 1 sleeps long (it is released mid-run); the attempt after release is quick.
    ids = [agent.submit("echo", {"requests": 1, "sleep_s": 60, "sleep_below_attempt": 2})
           for _ in range(2)]
    agent.wait_for(lambda: [j["state"] for j in agent.status()["jobs"]] == ["running"] * 2
                   and row(agent, "test.agent.echo")["ready"], what="both jobs running")
    agent.wait_for(lambda: len([r for r in read_jsonl(agent.module_data() / "runs.jsonl")
                                if r["event"] == "sleep"]) == 2, what="both runners sleeping")
    with hog(target) as h:
        crossed = h.event()
        assert crossed["event"] == "crossed", crossed
        agent.wait_for(lambda: row(agent, "test.agent.echo")["held"] == "preempt_memory"
                       and not row(agent, "test.agent.echo")["running"], timeout=30,
                       what="the service stopped and held preempt_memory")
        stopped_after = time.time() - crossed["t"]
        r = row(agent, "test.agent.echo")
        assert r["ready"] is False and r["accepting"] is False and r["users"] == 0
        jobs = agent.status()["jobs"]
        assert [j["state"] for j in jobs] == ["queued", "queued"], jobs
        assert all(j["released"] == 1 and j["attempts"] == 0 for j in jobs), jobs
        assert all(j["reason"] for j in jobs)
        prot = agent.status()["protection"]
        assert prot["last_victim"]["key"] == "test.agent.echo/echo", prot
        assert prot["pressure"] in ("soft", "hard")
    # Memory given back: the hold lifts, the jobs bring the service back and finish.
    done = [agent.wait(j, timeout=60) for j in ids]
    assert [j["state"] for j in done] == ["succeeded", "succeeded"], done
    assert [j["attempts"] for j in done] == [1, 1]  # the released attempt was not charged
    assert row(agent, "test.agent.echo")["held"] is None
    loads = (agent.module_data() / "loads").read_text().split()
    assert len(loads) == 2  # stopped once, started again
    status = {j["job_id"]: j for j in agent.status()["jobs"]}
    assert all(status[j]["released"] == 1 for j in ids)
    history = json.loads((agent.state_dir / "jobs" / ids[0] / "job.json").read_text())["history"]
    assert [h["outcome"] for h in history] == ["released", "succeeded"]
    assert history[0]["reason"] == "preempt_memory"
    assert "hard memory floor: stopping service test.agent.echo/echo" in agent.log()
    print(f"\nhard floor crossed -> service stopped: {stopped_after:.2f} s; "
          f"test took {time.monotonic() - t0:.1f} s")


def test_soft_floor_stops_an_idle_yieldable_service_never_a_non_yieldable_one(
        start_agent, tmp_path: Path) -> None:
    yielding = write_module(tmp_path / "y", service={"lifecycle": "always"})
    keep = write_module(tmp_path / "k", module_id="test.agent.keep",
                        service={"lifecycle": "always", "yieldable": False})
    args, target = floor_args(soft_below=2.5 * GiB, hard_below=None, margin=0.2 * GiB)
    agent = start_agent([yielding, keep], extra_args=args)
    agent.wait_for(lambda: row(agent, "test.agent.echo")["ready"]
                   and row(agent, "test.agent.keep")["ready"], what="both services ready")
    with hog(target) as h:
        assert h.event()["event"] == "crossed"
        agent.wait_for(lambda: row(agent, "test.agent.echo")["held"] == "preempt_memory"
                       and not row(agent, "test.agent.echo")["running"], timeout=30,
                       what="the idle yieldable service stopped and held")
        assert agent.status()["protection"]["pressure"] == "soft"
        k = row(agent, "test.agent.keep")
        assert k["ready"] is True and k["held"] is None, k
    agent.wait_for(lambda: row(agent, "test.agent.echo")["ready"], timeout=30,
                   what="the always service back once pressure ended")
    assert row(agent, "test.agent.echo")["held"] is None
    ops = [e["op"] for e in read_jsonl(agent.module_data("test.agent.keep") / "events.jsonl")
           if e["event"] == "op" and e["op"] in ("start", "stop")]
    assert ops == ["start"]  # never stopped
    ops = [e["op"] for e in read_jsonl(agent.module_data() / "events.jsonl")
           if e["event"] == "op" and e["op"] in ("start", "stop")]
    # Stopped once under the pressure and started again (another dip of the shared machine's
    # memory after the test's own may stop it again: only the first cycle is the test's).
    assert ops[:3] == ["start", "stop", "start"], ops


@pytest.mark.parametrize("bad", ["--mem-soft-floor=abc", "--mem-hard-floor=150%",
                                 "--mem-sample-s=0", "--memory-budget-gb=-1"])
def test_bad_protection_options_are_refused_by_name(bad: str, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "oarbank_agent", "run", "--state-dir",
                        str(tmp_path / "s"), "--module", str(tmp_path), bad],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert bad.split("=")[0] in r.stderr, r.stderr
