"""Figure 5: the agent's footprint: RSS and CPU while idle, and with attempts holding
connections (real attempts, each with one brokered connection open); open descriptors before,
while holding, and after. The RSS baseline is a bare interpreter of the same Python."""

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


def _watch(proc: psutil.Process, seconds: float, step: float = 0.5) -> tuple[list, list]:
    """(RSS samples in bytes, CPU % per step) over ``seconds``."""
    rss, cpu = [], []
    t = proc.cpu_times()
    last_cpu, last = t.user + t.system, time.monotonic()
    end = last + seconds
    while True:
        time.sleep(min(step, max(0.0, end - time.monotonic())))
        t = proc.cpu_times()
        now = time.monotonic()
        c = t.user + t.system
        cpu.append(100.0 * (c - last_cpu) / (now - last))
        rss.append(float(proc.memory_info().rss))
        last_cpu, last = c, now
        if now >= end:
            return rss, cpu


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
    time.sleep(0.5)  # let the figures before settle (ops finishing, timers)
    fds_before = float(proc.num_fds())
    idle_rss, idle_cpu = _watch(proc, p.idle_s, step=1.0 if p.idle_s >= 5 else 0.5)

    rd, release = b.tmp / "hold-ready", b.tmp / "hold-release"
    rd.mkdir()
    ids = agent.submit(MODULE_ID, "bench", [{"mode": "hold", "ready_dir": str(rd),
                                             "release_file": str(release)}]
                       * p.hold_attempts)
    deadline = time.monotonic() + 120
    try:
        while len(list(rd.iterdir())) < p.hold_attempts:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(list(rd.iterdir()))} of {p.hold_attempts} "
                                   "attempts hold a connection after 120 s")
            time.sleep(0.05)
        fds_holding = float(proc.num_fds())
        hold_rss, hold_cpu = _watch(proc, p.hold_s)
    finally:
        release.write_text("go")
        jobs = agent.wait_all(ids)
    bad = [j for j in jobs if j["state"] != "succeeded"]
    if bad:
        raise RuntimeError(f"hold job {bad[0]['job_id']}: {bad[0]['reason']}")
    time.sleep(0.5)
    fds_after = float(proc.num_fds())
    base = "bare python interpreter"
    return {"title": TITLE, "metrics": {
        "idle_rss": metric(idle_rss, unit="MB", scale=MB, baseline=[bare], baseline_name=base,
                           targets={"median": "<= 80"}),
        "idle_cpu": metric(idle_cpu, unit="%", targets={"median": "<= 0.5"}),
        "holding_rss": metric(hold_rss, unit="MB", scale=MB, baseline=[bare],
                              baseline_name=base, targets={"median": "<= 80"},
                              note=f"{p.hold_attempts} attempts holding a connection"),
        "holding_cpu": metric(hold_cpu, unit="%",
                              note=f"{p.hold_attempts} attempts holding a connection"),
        "fds_holding": metric([fds_holding], unit="fds", baseline=[fds_before],
                              baseline_name="fds before", with_p99=False),
        "fds_after": metric([fds_after], unit="fds", baseline=[fds_before],
                            baseline_name="fds before", with_p99=False,
                            targets={"ratio": "== 1"}),
    }, "details": {"attempts": p.hold_attempts, "idle_s": p.idle_s, "hold_s": p.hold_s}}
