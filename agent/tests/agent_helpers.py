"""Helpers for the agent tests: real agents (``oarbank-agent run`` subprocesses) on tmp state
dirs, test modules written into tmp dirs, leftover-process detection."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from oarbank_agent import platform
from oarbank_agent.operate import control
from oarbank_agent.operate.demo import AgentProcess
from testsupport.livefiles import read_jsonl as finished_records
from testsupport.privilege import AGENT_UNDUMPABLE, require_root

MODFILES = Path(__file__).parent / "modfiles"
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "modelserver"


# --- leftovers ----------------------------------------------------------------------------------


def processes_referencing(path: Path) -> list[str]:
    """Live processes whose command line, cwd or environment mentions ``path`` (psutil: the
    same on Linux, under the darwin profile, where ``/proc`` is off limits, and on a Mac)."""
    needle = str(path)
    found = []
    me = os.getpid()
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.cmdline())
            env = "\0".join(f"{k}={v}" for k, v in p.environ().items())
            cwd = p.cwd()
        except (psutil.Error, OSError):
            continue
        if needle in cmd or needle in env or cwd.startswith(needle):
            found.append(f"{p.pid}: {cmd.strip()[:200]}")
    return found


def end_leftovers(path: Path) -> list[str]:
    """A test's end: SIGKILL every process still referencing ``path`` (so a failing test's do
    not outlive it) and return what was found, for the test to assert empty."""
    left = processes_referencing(path)  # (never this process)
    for line in left:
        try:
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


# --- modules ------------------------------------------------------------------------------------


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def write_module(root: Path, *, module_id: str = "test.agent.echo",
                 service: dict[str, Any] | None = None, stages: list[dict[str, Any]] | None = None,
                 runner: dict[str, Any] | None = None, with_service: bool = True,
                 extra: str = "", requires: dict[str, Any] | None = None) -> Path:
    """A module using tests/modfiles/echo_service.py and echo_runner.py. ``service`` overrides
    keys of the one `echo` service; ``stages`` replaces the default stages; ``requires``
    overrides keys of ``[requires]``."""
    root.mkdir(parents=True, exist_ok=True)
    for f in ("echo_service.py", "echo_runner.py"):
        shutil.copy(MODFILES / f, root / f)
    svc = {"name": "echo", "exec": ["python", "-I", "{bundle}/echo_service.py"],
           "lifecycle": "on_demand", "idle_timeout_s": 30, "start_timeout_s": 10,
           "stop_timeout_s": 10, "endpoint": True, "provides": {"pools": ["echo"]}}
    svc.update(service or {})
    if stages is None:
        stages = [{"name": "echo", "timeout_s": 60, "requires": {"pools": {"echo": 1}}},
                  {"name": "plain", "timeout_s": 60}]
    run = {"exec": ["python", "-I", "{bundle}/echo_runner.py"], "stop_grace_s": 2}
    run.update(runner or {})
    req: dict[str, Any] = {"core": ">=2.5,<3", "runner_protocol": [1]}
    if with_service:
        req["service_protocol"] = [1]
    req.update(requires or {})
    lines = ["manifest = 1", "", "[module]", f"id = {_toml_value(module_id)}",
             'version = "0.0.1"', 'description = "agent test module"', "", "[requires]",
             *(f"{k} = {_toml_value(v)}" for k, v in req.items())]
    lines += ["", "[runner]"] + [f"{k} = {_toml_value(v)}" for k, v in run.items()]
    for st in stages:
        lines += ["", "[[stages]]"] + [f"{k} = {_toml_value(v)}" for k, v in st.items()]
    if with_service:
        lines += ["", "[[services]]"] + [f"{k} = {_toml_value(v)}" for k, v in svc.items()]
    (root / "oarbank-module.toml").write_text("\n".join(lines) + "\n" + extra)
    return root


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records in ``path`` its writers have finished. ``<state>/modules/<id>/data/runs.jsonl``
    reads as every attempt's runner records: a runner may write only its workdir (the sandbox),
    so the test runners record in ``<state>/jobs/<job>/a<n>/runs.jsonl``; merged in time order."""
    rows = finished_records(path)
    if path.name == "runs.jsonl" and path.parent.name == "data" and len(path.parents) > 3 \
            and path.parents[2].name == "modules":
        for p in sorted((path.parents[3] / "jobs").glob("*/a*/runs.jsonl")):
            rows += finished_records(p)
        rows.sort(key=lambda r: r.get("t", 0))
    return rows


def runner_file(agent: Any, attempt: str, name: str) -> Path:
    """Where the runner of attempt ``<job id>.<n>`` writes ``name``: its workdir."""
    job_id, _, number = attempt.rpartition(".")
    return agent.state_dir / "jobs" / job_id / f"a{number}" / name


def job_record(agent: Any, job: str) -> dict[str, Any]:
    """The job's record as the agent keeps it (``<state>/jobs/<job>/job.json``)."""
    return dict(json.loads((agent.state_dir / "jobs" / job / "job.json").read_text()))


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except (psutil.Error, OSError):
        return False


# --- a portal -----------------------------------------------------------------------------------

PORTAL = [sys.executable, "-m", "oarbank_ui.cli"]


@contextlib.contextmanager
def running_portal(tmp_path: Path, *serve_args: str) -> Iterator[dict[str, Any]]:
    """A real portal (``oarbank-portal serve``) on a loopback port with its SQLite store in
    ``tmp_path``: ``{"url", "db"}``; ended (its session) at the end."""
    db = tmp_path / "portal.db"
    log = open(tmp_path / "portal.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([*PORTAL, "serve", "--db", str(db), "--listen", "127.0.0.1:0",
                             *serve_args],
                            stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = b""
        deadline = time.monotonic() + 60
        while not line.endswith(b"\n"):
            assert time.monotonic() < deadline and proc.poll() is None, "portal did not start"
            if select.select([proc.stdout], [], [], 1)[0]:
                line += os.read(proc.stdout.fileno(), 1)
        yield {"url": line.decode().split()[-1], "db": db}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        assert proc.stdout is not None
        proc.stdout.close()
        log.close()


# --- agents -------------------------------------------------------------------------------------


class RunningAgent:
    def __init__(self, root: Path, modules: list[Path], settings: dict[str, Any],
                 state_dir: Path | None = None, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.root = root
        self.state_dir = state_dir or root / "state"
        root.mkdir(parents=True, exist_ok=True)
        paths = {}
        for name, value in settings.items():
            p = root / f"settings-{name}.json"
            p.write_text(json.dumps(value))
            paths[name] = p
        # A test's agent is stopped (SIGTERM) with whatever still runs: 2 s of drain, not the
        # 30 s default, unless the test says otherwise (a later flag wins).
        self.proc = AgentProcess(self.state_dir, modules, paths, node_id="test-node",
                                 log_path=root / "agent.log", ready_timeout=60,
                                 extra_args=["--drain-s", "2", *(extra_args or [])], env=env)
        self.stopped = False
        self._settled_names: list[str] | None = None  # settled_fds: for wait_fds_back's error

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return (self.root / "agent.log").read_text(errors="replace")

    def why(self, job: dict[str, Any]) -> str:
        """A failed job, for an assertion's message: its reason, the end of each attempt's
        runner log, then the agent's log (a string: pytest shows it whole, a tuple cut short)."""
        parts = [f"state={job.get('state')} reason={job.get('reason')!r}"]
        for log in sorted((self.state_dir / "jobs" / str(job.get("job_id"))).glob("a*/runner.log")):
            parts.append(f"--- {log.parent.name}/runner.log\n"
                         f"{log.read_text(errors='replace')[-3000:]}")
        parts.append(f"--- agent.log\n{self.log()[-3000:]}")
        return "\n".join(parts)

    def module_data(self, module_id: str = "test.agent.echo") -> Path:
        return self.state_dir / "modules" / module_id / "data"

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "oarbank_agent", *args], capture_output=True,
                              text=True, timeout=timeout)

    def submit(self, stage: str, payload: dict[str, Any], module: str = "echo") -> str:
        reply = control.request(self.state_dir, {"op": "submit", "module": module,
                                                 "stage": stage, "payload": payload})
        assert reply["ok"], reply
        return reply["job_id"]

    def wait(self, job_id: str, timeout: float = 120) -> dict[str, Any]:
        reply = control.request(self.state_dir, {"op": "wait", "job_id": job_id,
                                                 "timeout": timeout}, timeout=timeout + 10)
        assert reply["ok"], reply
        return reply["job"]

    def run_job(self, stage: str, payload: dict[str, Any], module: str = "echo") -> dict[str, Any]:
        return self.wait(self.submit(stage, payload, module))

    def status(self) -> dict[str, Any]:
        return control.request(self.state_dir, {"op": "status"})["status"]

    def wire_attempt(self, job_id: str) -> int:
        """The integer services saw for the job's latest attempt (``status`` maps it)."""
        job = next(j for j in self.status()["jobs"] if j["job_id"] == job_id)
        assert isinstance(job["wire_attempt"], int), job
        return job["wire_attempt"]

    def service_row(self, service: str = "echo") -> dict[str, Any]:
        return next(r for r in self.status()["services"] if r["service"] == service)

    def wait_for(self, pred: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
        """Tests only: poll an observable condition of the running agent with a deadline."""
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or pred}")
            time.sleep(0.05)

    def fd_count(self) -> int:
        require_root(AGENT_UNDUMPABLE)
        return int(psutil.Process(self.pid).num_fds())

    def fd_names(self) -> list[str]:
        """``fd=what it names`` for each of the agent's descriptors (without ``/proc``, under
        the darwin profile and on a Mac: its files and sockets, as psutil sees them)."""
        require_root(AGENT_UNDUMPABLE)
        if platform.name() != "linux":
            proc = psutil.Process(self.pid)
            named = {f.fd: f.path for f in proc.open_files()}
            named.update((c.fd, f"socket:{c.family.name}:{c.laddr or ''}")
                         for c in proc.net_connections(kind="all") if c.fd >= 0)
            return [f"{fd}={what}" for fd, what in sorted(named.items())]
        out = []
        for fd in sorted(os.listdir(f"/proc/{self.pid}/fd"), key=int):
            try:
                out.append(f"{fd}={os.readlink(f'/proc/{self.pid}/fd/{fd}')}")
            except OSError:
                pass
        return out

    def settled_fds(self) -> int:
        """The agent's descriptor count once it holds still (an op of its start, or a control
        connection that just answered, may still be closing); remembered for
        ``wait_fds_back``'s message."""
        last = -1
        for _ in range(50):
            n = self.fd_count()
            if n == last:
                break
            last = n
            time.sleep(0.2)
        self._settled_names = self.fd_names()
        return last

    def wait_fds_back(self, baseline: int, timeout: float = 10) -> None:
        """Wait until the agent holds no more descriptors than ``baseline``; the error names
        the ones it holds that it did not hold when ``settled_fds`` counted (all of them when
        the baseline was counted otherwise)."""
        deadline = time.monotonic() + timeout
        while self.fd_count() > baseline:
            if time.monotonic() > deadline:
                now = self.fd_names()
                if self._settled_names is None:
                    held = f"holding: {now}"
                else:
                    held = f"new: {[n for n in now if n not in set(self._settled_names)]}"
                raise AssertionError(f"agent descriptors not back to {baseline} after "
                                     f"{timeout:g}s: {len(now)}, {held}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the agent alone (what a crash looks like): its children stay behind."""
        self.stopped = True
        self.proc.proc.kill()
        self.proc.proc.wait()
        self.proc.stop()  # closes our ends; the agent's children are in their own sessions

    def watcher_pid(self) -> int:
        """The agent's fate-sharing watcher (platform/posix/tether.py), as its log names it."""
        [pid] = [int(m) for m in re.findall(r"watcher pid (\d+)", self.log())]
        return pid

    def kill_with_watcher(self) -> None:
        """SIGKILL the agent's watcher, then the agent: its runners' groups are left behind
        (with the watcher alive they would be ended at once), as when both die together, e.g.
        to the kernel's OOM killer. What a restarted agent must then end itself."""
        watcher = self.watcher_pid()
        os.kill(watcher, signal.SIGKILL)
        self.wait_for(lambda: not alive(watcher), 10, "the watcher to go")
        self.kill()

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        rc = self.proc.stop()
        assert rc == 0, f"agent exited with {rc}:\n{self.log()[-3000:]}"
        # Under the darwin profile: a Linux-only call the agent made, even one it swallowed
        # (platform/darwin/linuxfree.py says each on stderr, which is this log).
        tripped = [line for line in self.log().splitlines() if "oarbank tripwire:" in line]
        assert not tripped, "the agent made Linux-only calls:\n" + "\n".join(tripped[:5])
        left = processes_referencing(self.root)
        assert not left, "left behind by the agent:\n" + "\n".join(left)
        records = list((self.state_dir / "procs").glob("*.json"))
        assert not records, f"process-group records not cleared: {records}"


