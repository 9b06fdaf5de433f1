"""Figure 5: the agent's footprint: RSS and CPU while idle, and with attempts holding
connections (real attempts, each with one brokered connection open); open descriptors before,
while holding, and after. The agent's process factory counts as the agent (RSS, CPU and
descriptors of both). The RSS baseline is a bare interpreter of the same Python."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import psutil

from ..context import MODULE_ID, Bench
from ..stats import metric

TITLE = "5. agent footprint"
MB = 1.0 / 2**20


def _with_factory(proc: psutil.Process) -> list[psutil.Process]:
    """The agent and its process factory (``--process-factory on``): one footprint."""
    out = [proc]
    for child in proc.children():
        try:
            if "oarbank_agent.platform.linux.factory" in child.cmdline():
                out.append(child)
        except psutil.Error:
            continue
    return out


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        t = p.cpu_times()
        total += t.user + t.system
    return total


def _fds(proc: psutil.Process) -> float:
    return float(sum(p.num_fds() for p in _with_factory(proc)))


def _watch(proc: psutil.Process, seconds: float, step: float = 0.5) -> tuple[list, list]:
    """(RSS samples in bytes, [CPU % over the whole window]) over ``seconds``, of the agent
    and its process factory together.

    CPU time comes in clock ticks (10 ms), so one figure over the whole window is the only
    honest one: per-step values would be 0 or 2 %."""
    rss = []
    procs = _with_factory(proc)
    first_cpu, start = _cpu(procs), time.monotonic()
    end = start + seconds
    while True:
        time.sleep(min(step, max(0.0, end - time.monotonic())))
        cpu = _cpu(procs)
        now = time.monotonic()
        rss.append(float(sum(p.memory_info().rss for p in procs)))
        if now >= end:
            return rss, [100.0 * (cpu - first_cpu) / (now - start)]


def _bare_python_rss() -> float:
    proc = subprocess.Popen([sys.executable, "-I", "-c", "import sys; print(1, flush=True); "
                             "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        return float(psutil.Process(proc.pid).memory_info().rss)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


def run(b: Bench) -> dict[str, Any]:
    p = b.params
    agent = b.agent()
    proc = psutil.Process(agent.pid)
    bare = _bare_python_rss()
    # The bench service up first (its channel is one of the agent's descriptors), then idle.
    agent.run_jobs(MODULE_ID, "bench", [{"mode": "requests", "per_request": 1, "keepalive": 1,
                                         "warmup": 0}])
    time.sleep(0.5)  # let what ran before settle (ops finishing, timers)
    fds_before = _fds(proc)
    idle_rss, idle_cpu = _watch(proc, p.idle_s, step=1.0 if p.idle_s >= 5 else 0.5)

    release = b.tmp / "hold-release"
    ids = agent.submit(MODULE_ID, "bench", [{"mode": "hold", "release_file": str(release)}]
                       * p.hold_attempts)
    deadline = time.monotonic() + 120
    try:
        while agent.attempts_ready(ids) < p.hold_attempts:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {agent.attempts_ready(ids)} of {p.hold_attempts} "
                                   "attempts hold a connection after 120 s")
            time.sleep(0.05)
        fds_holding = _fds(proc)
        hold_rss, hold_cpu = _watch(proc, p.hold_s)
    finally:
        release.write_text("go")
        jobs = agent.wait_all(ids)
    bad = [j for j in jobs if j["state"] != "succeeded"]
    if bad:
        raise RuntimeError(f"hold job {bad[0]['job_id']}: {bad[0]['reason']}")
    time.sleep(0.5)
    fds_after = _fds(proc)
    base = "bare python interpreter"
    return {"title": TITLE, "metrics": {
        "idle_rss": metric(idle_rss, unit="MB", scale=MB, baseline=[bare], baseline_name=base,
                           targets={"median": "<= 80"}),
        "idle_cpu": metric(idle_cpu, unit="%", targets={"median": "<= 0.5"}, with_p99=False,
                           note=f"over {p.idle_s:g} s; resolution {1 / p.idle_s:.2g} %"),
        "holding_rss": metric(hold_rss, unit="MB", scale=MB, baseline=[bare],
                              baseline_name=base, targets={"median": "<= 80"},
                              note=f"{p.hold_attempts} attempts holding a connection"),
        "holding_cpu": metric(hold_cpu, unit="%", with_p99=False,
                              note=f"{p.hold_attempts} attempts holding a connection"),
        "fds_holding": metric([fds_holding], unit="fds", baseline=[fds_before],
                              baseline_name="fds before", with_p99=False),
        "fds_after": metric([fds_after], unit="fds", baseline=[fds_before],
                            baseline_name="fds before", with_p99=False,
                            targets={"ratio": "== 1"}),
    }, "details": {"attempts": p.hold_attempts, "idle_s": p.idle_s, "hold_s": p.hold_s}}
