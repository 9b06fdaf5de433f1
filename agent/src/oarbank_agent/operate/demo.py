"""``oarbank-agent demo``: N generate jobs through one warm model service.

Starts a real ``oarbank-agent run`` (a subprocess in its own session) on a temporary state
dir with ``examples/modelserver``, submits N jobs at once, shows progress on stderr, prints a
summary, and cleans up everything it started (agent stopped, its group ended, temp dir gone).
With ``--compare`` it then runs the same N jobs cold (``demo_cold``: each loads the model
itself, as many at a time as the warm service has slots) and prints both, measured.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from oarbank_agent import platform
from oarbank_agent.operate import control
from oarbank_agent.operate.demo_cold import ColdRun, run_cold

__all__ = ["run_demo", "find_example", "AgentProcess"]

PROMPTS = ["The quick brown fox", "jumps over", "the lazy dog"]
SLOTS = 4  # jobs the warm service serves at once; the cold run runs as many at a time


def find_example(name: str = "modelserver") -> Path:
    """examples/<name> of the repository this package is installed from (editable install),
    or OARBANK_EXAMPLES_DIR/<name>."""
    candidates = []
    if os.environ.get("OARBANK_EXAMPLES_DIR"):
        candidates.append(Path(os.environ["OARBANK_EXAMPLES_DIR"]) / name)
    here = Path(__file__).resolve()
    candidates += [p / "examples" / name for p in here.parents]
    candidates.append(Path.cwd() / "examples" / name)
    for c in candidates:
        if (c / "oarbank-module.toml").is_file():
            return c
    raise FileNotFoundError(f"cannot find examples/{name} (looked in: "
                            f"{', '.join(str(c) for c in candidates[:3])} ...); "
                            "set OARBANK_EXAMPLES_DIR")


class AgentProcess:
    """A real ``oarbank-agent run`` in its own session; ``stop`` ends it and its group. It
    also stops (drains, then ends what it started) when the thread that started it dies."""

    def __init__(self, state_dir: Path, modules: list[Path],
                 settings: dict[str, Path] | None = None, node_id: str = "demo-node",
                 log_path: Path | None = None, ready_timeout: float = 60.0,
                 extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        argv = [sys.executable, "-m", "oarbank_agent", "run", "--state-dir", str(state_dir),
                "--node-id", node_id, *(extra_args or [])]
        for m in modules:
            argv += ["--module", str(m)]
        for name, path in (settings or {}).items():
            argv += ["--settings", f"{name}={path}"]
        self.state_dir = state_dir
        self.log_path = log_path or state_dir.parent / "agent.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self.proc = platform.current().sessions.start(
            argv, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
            env=env, stop_with_parent=True)
        assert self.proc.stdout is not None
        # The agent prints one line once its control socket listens.
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + ready_timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                sel.close()
                self.stop()
                raise RuntimeError(f"the agent did not get ready within {ready_timeout:g}s; "
                                   f"see {self.log_path}")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                sel.close()
                self.stop()
                raise RuntimeError(f"the agent exited before it was ready; see {self.log_path}:\n"
                                   + self.log_path.read_text(errors="replace")[-2000:])
            line += chunk
        sel.close()
        self.ready_line = line.decode(errors="replace").strip()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 60.0) -> int | None:
        """Ask it to stop (it drains), wait; then make sure nothing of its session is left."""
        rc = None
        if self.proc.poll() is None:
            platform.current().sessions.ask_to_stop(self.proc)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        platform.current().sessions.kill_session(self.proc.pid)
        if rc is None:
            rc = self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()
        return rc


def run_demo(jobs: int = 20, load_s: float = 1.0, as_json: bool = False,
             sandbox: str = "auto", compare: bool = False) -> int:
    if jobs < 1:
        print("oarbank-agent demo: --jobs must be at least 1", file=sys.stderr)
        return 2
    example = find_example()
    tmp = Path(tempfile.mkdtemp(prefix="oarbank-demo-"))
    agent: AgentProcess | None = None
    tty = sys.stderr.isatty()
    try:
        state = tmp / "state"
        settings = tmp / "modelserver-settings.json"
        settings.write_text(json.dumps({"load_s": load_s, "slots": SLOTS}))
        t0 = time.monotonic()
        agent = AgentProcess(state, [example], {"modelserver": settings},
                             extra_args=["--sandbox", sandbox])
        ids = []
        with control.Client(state) as c:
            for i in range(jobs):
                reply = c.call({"op": "submit", "module": "modelserver", "stage": "generate",
                                "payload": {"prompts": _prompts(i)}})
                if not reply.get("ok"):
                    raise RuntimeError(f"submit refused: {reply.get('error')}")
                ids.append(reply["job_id"])
        records: list[dict[str, Any]] = []

        def wait(job_id: str) -> dict[str, Any]:
            with control.Client(state, timeout=None) as c:
                reply = c.call({"op": "wait", "job_id": job_id})
            if not reply.get("ok"):
                raise RuntimeError(f"wait for {job_id}: {reply.get('error')}")
            return reply["job"]

        _progress(0, jobs, tty)
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(jobs, 32)) as pool:
            for fut in concurrent.futures.as_completed([pool.submit(wait, j) for j in ids]):
                records.append(fut.result())
                _progress(len(records), jobs, tty)
        wall = time.monotonic() - t0
        if tty:
            sys.stderr.write("\n")
        status = control.request(state, {"op": "status"})["status"]
        module_id = status["services"][0]["module"] if status["services"] else "?"
        loads_file = state / "modules" / module_id / "data" / "model.loads"
        loads = [ln for ln in loads_file.read_text().splitlines() if ln.strip()] \
            if loads_file.exists() else []
        pids = sorted({p for r in records if r.get("result")
                       for p in r["result"].get("provenance", {}).get("service_pids", [])})
        succeeded = sum(1 for r in records if r["state"] == "succeeded")
        times = [j for j in status["jobs"] if j.get("started_at") and j.get("finished_at")]
        summary = {"jobs": jobs, "succeeded": succeeded, "model_loads": len(loads),
                   "service_pids": pids, "wall_s": round(wall, 3)}
        endpoints = status.get("sandbox", {}).get("endpoints")
        cold = None
        if compare:
            agent.stop()  # the warm run is over: the cold one gets the machine to itself
            agent = None
            if not as_json:
                print(f"cold run: the same {jobs} jobs, each loading the model itself "
                      f"({SLOTS} at a time) ...", file=sys.stderr, flush=True)
            cold = run_cold(example, tmp / "cold-data", [_prompts(i) for i in range(jobs)],
                            load_s, SLOTS)
            summary["cold"] = {"succeeded": cold.succeeded, "model_loads": cold.model_loads,
                               "wall_s": round(cold.wall_s, 3), "parallel": cold.parallel}
        if as_json:
            print(json.dumps(summary))
        else:
            mean_run = (sum(j["finished_at"] - j["started_at"] for j in times) / len(times)
                        if times else 0.0)
            print(f"jobs succeeded: {succeeded} of {jobs}")
            print(f"model loads:    {len(loads)}")
            print(f"service pid(s): {', '.join(map(str, pids)) or '-'}")
            print(f"sandbox:        endpoints {endpoints} (--sandbox {sandbox})")
            print(f"wall time:      {wall:.2f}s (agent start included; model load_s={load_s:g})")
            print(f"per job:        {mean_run * 1000:.0f} ms from runner start to record final")
            for r in records:
                if r["state"] != "succeeded":
                    print(f"  {r['job_id']}: {r['state']}: {r['reason']}")
            if cold is not None:
                _print_comparison(jobs, wall, len(loads), cold)
        ok = succeeded == jobs and (cold is None or cold.succeeded == jobs)
        return 0 if ok else 1
    finally:
        if agent is not None:
            agent.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _prompts(i: int) -> list[str]:
    return [f"{p} #{i}" for p in PROMPTS]


def _print_comparison(jobs: int, warm_wall: float, warm_loads: int, cold: ColdRun) -> None:
    print()
    print(f"the same {jobs} jobs cold (each loads the model itself, {cold.parallel} at a time):")
    print(f"  jobs succeeded: {cold.succeeded} of {cold.jobs}")
    print(f"  model loads:    {cold.model_loads} (warm: {warm_loads})")
    print(f"  wall time:      {cold.wall_s:.2f}s (warm: {warm_wall:.2f}s, the agent's own "
          f"start included)")
    if warm_wall > 0:
        print(f"  cold / warm:    {cold.wall_s / warm_wall:.1f}x the time, "
              f"{cold.model_loads - warm_loads} more model loads")
    for e in cold.errors[:5]:
        print(f"  a cold job failed: {e}")


def _progress(done: int, total: int, tty: bool) -> None:
    if tty:
        sys.stderr.write(f"\rjobs done: {done}/{total}")
        sys.stderr.flush()
    elif done in (0, total) or done % max(1, total // 4) == 0:
        sys.stderr.write(f"jobs done: {done}/{total}\n")
