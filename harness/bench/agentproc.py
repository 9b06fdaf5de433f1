"""A real ``oarbank-agent run`` for the bench, and the control-socket calls it needs.

The agent runs as ``python -m oarbank_agent run`` in its own session (so ``stop`` can end
everything it left). Jobs are submitted and waited on over its control socket, as
``oarbank-agent submit --wait`` does, without paying a CLI process start per job.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from oarbank_agent.operate import control

__all__ = ["Agent", "BENCH_MODULE", "JobFailed", "PYSPY_RATE"]

BENCH_MODULE = Path(__file__).resolve().parent / "modules" / "bench"
PYSPY_RATE = int(os.environ.get("BENCH_PYSPY_RATE", "500"))  # samples a second


class JobFailed(RuntimeError):
    pass


class Agent:
    """Start with ``Agent(state_dir, modules, settings)``; always ``stop()`` (or use ``with``)."""

    def __init__(self, state_dir: Path, modules: list[Path],
                 settings: dict[str, dict[str, Any]] | None = None,
                 ready_timeout: float = 60.0, profile: Path | None = None,
                 extra_args: list[str] | None = None) -> None:
        self.state_dir = state_dir
        self._spy: subprocess.Popen[bytes] | None = None
        state_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "oarbank_agent", "run", "--state-dir", str(state_dir),
                "--node-id", "bench-node"]
        for m in modules:
            argv += ["--module", str(m)]
        argv += extra_args or []  # e.g. --process-factory off (figure 6 compares both)
        for name, value in (settings or {}).items():
            f = state_dir.parent / f"{state_dir.name}-{name}-settings.json"
            f.write_text(json.dumps(value))
            argv += ["--settings", f"{name}={f}"]
        self.log_path = state_dir.parent / f"{state_dir.name}-agent.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready_line(ready_timeout)
        except BaseException:
            self.stop()
            raise
        if profile is not None:
            self._profile(profile)

    def profile_to(self, out: Path) -> None:
        """From now on the profile goes to ``out`` (the one before is written and closed)."""
        self._stop_spy()
        self._profile(out)

    def _profile(self, out: Path) -> None:
        """py-spy on the agent (collapsed stacks, idle frames left out) until ``stop``."""
        spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
        if spy is None:
            raise RuntimeError("--profile needs py-spy (pip install py-spy)")
        out.parent.mkdir(parents=True, exist_ok=True)
        rate = str(PYSPY_RATE)
        # --gil: only samples holding the GIL, i.e. the agent's own CPU, not its waits.
        self._spy = subprocess.Popen([spy, "record", "--pid", str(self.pid), "--rate", rate,
                                      "--gil", "--nonblocking", "--format", "raw",
                                      "--output", str(out)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # py-spy attaches

    def _wait_ready_line(self, timeout: float) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise RuntimeError(f"the agent was not ready within {timeout:g}s; "
                                       f"see {self.log_path}")
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError("the agent exited before it was ready:\n"
                                       + self.log_path.read_text(errors="replace")[-2000:])
                buf += chunk

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _stop_spy(self) -> None:
        if self._spy is not None:
            self._spy.send_signal(signal.SIGINT)  # py-spy writes its file and exits
            try:
                self._spy.wait(30)
            except subprocess.TimeoutExpired:
                self._spy.kill()
                self._spy.wait()
            self._spy = None

    def stop(self, timeout: float = 60.0) -> None:
        self._stop_spy()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever its session left
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- control socket -------------------------------------------------------------------

    def attempts_ready(self, job_ids: list[str], marker: str = "bench.ready") -> int:
        """How many of these jobs have an attempt that left `marker` in its workdir
        (``<state>/jobs/<job>/a<n>/``: a sandboxed runner writes nowhere else)."""
        return sum(1 for j in job_ids if any((self.state_dir / "jobs" / j).glob(f"a*/{marker}")))

    def submit(self, module: str, stage: str, payloads: list[dict[str, Any]]) -> list[str]:
        ids = []
        with control.Client(self.state_dir) as c:
            for p in payloads:
                reply = c.call({"op": "submit", "module": module, "stage": stage, "payload": p})
                if not reply.get("ok"):
                    raise RuntimeError(f"submit refused: {reply.get('error')}")
                ids.append(reply["job_id"])
        return ids

    def wait(self, job_id: str, timeout: float = 120.0) -> dict[str, Any]:
        with control.Client(self.state_dir, timeout=timeout + 5) as c:
            reply = c.call({"op": "wait", "job_id": job_id, "timeout": timeout})
        if not reply.get("ok"):
            raise JobFailed(f"job {job_id}: {reply.get('error')}")
        return reply["job"]

    def wait_all(self, ids: list[str], timeout: float = 120.0) -> list[dict[str, Any]]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(ids), 64))) as ex:
            return list(ex.map(lambda j: self.wait(j, timeout), ids))

    def run_jobs(self, module: str, stage: str, payloads: list[dict[str, Any]],
                 timeout: float = 120.0) -> list[dict[str, Any]]:
        """Submit, wait, and return each job's result payload; a failed job raises."""
        jobs = self.wait_all(self.submit(module, stage, payloads), timeout)
        for j in jobs:
            if j.get("state") != "succeeded":
                raise JobFailed(f"job {j.get('job_id')} {j.get('state')}: {j.get('reason')} "
                                f"(see {self.state_dir}/jobs/{j.get('job_id')})")
        return [j["result"]["payload"] for j in jobs]

    def status(self) -> dict[str, Any]:
        return control.request(self.state_dir, {"op": "status"})["status"]

    def service_row(self, service: str) -> dict[str, Any] | None:
        for row in self.status()["services"]:
            if row["service"] == service:
                return row
        return None

    def wait_service(self, service: str, running: bool, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            row = self.service_row(service)
            if row is not None and row["running"] == running:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"service {service} not running={running} after {timeout:g}s: "
                                   f"{row}")
            time.sleep(0.02)
