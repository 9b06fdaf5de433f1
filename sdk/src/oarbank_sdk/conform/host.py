"""A minimal, synchronous agent for the conformance kit (and for tests that play the agent).

It does what the agent does to one module, and nothing more (contract sections 2 to 4):

- ``NodeDirs``: a throw-away node: the module data dir (HOME and TMPDIR inside it), the
  settings, limits and tools files;
- ``op_env`` / ``run_op``: the exact op environment, each op in its own process group (on
  Windows a kill-on-close job object, ``oarbank_sdk.winjob``, known by its leader's pid), its stdout's
  last JSON line as the answer;
- ``Channel`` / ``Connector`` (``agentends.py``, re-exported here): the agent's ends of an
  endpoint channel and of an attempt's connector;
- ``run_runner``: one attempt of the module's runner, with its spec and its connector.

Threads are fine here (unlike in the agent, which runs one event loop): each Channel and
Connector has one reader thread; sends are serialised by a lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from oarbank_sdk import _transport, environments, winjob
from oarbank_sdk._opdoc import last_json_object
from oarbank_sdk.conform.agentends import Channel, Connector, wire_attempt
from oarbank_sdk.manifest import platform_token

__all__ = [
    "NodeDirs",
    "OpResult",
    "platform_token",
    "wire_attempt",
    "op_env",
    "run_op",
    "spawn",
    "group_pids",
    "end_group",
    "Channel",
    "Connector",
    "Attempt",
    "runner_env",
    "run_runner",
]


class NodeDirs:
    """A temporary node for one module: removed by ``cleanup``."""

    def __init__(self, module_id: str, settings: dict | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="oarbank-conform-"))
        self.module_id = module_id
        self.data = self.root / "modules" / module_id
        self.home = self.data / "home"
        self.tmp = self.data / "tmp"
        for d in (self.home, self.tmp):
            d.mkdir(parents=True)
        self.settings_file = self.root / "settings.json"
        self.limits_file = self.root / "limits.json"
        self.tools_file = self.root / "tools.json"
        self.settings_file.write_text(json.dumps(settings or {}))
        self.limits_file.write_text("{}")
        self.tools_file.write_text("{}")
        self.node_id = "conform-" + (platform.node() or "node")
        # requirements.txt -> its environment (envs.py); read by every child that runs in one
        self.envs: dict[str, Path] = {}

    def expand(self, argv: tuple[str, ...] | list[str], bundle: Path) -> list[str]:
        """``expand_exec`` with ``python`` the environment's interpreter where it has one."""
        from .. import manifest as _manifest
        from .envs import python_for

        python = python_for(self.envs, argv, bundle)
        return (_manifest.expand_exec(list(argv), bundle, python) if python
                else _manifest.expand_exec(list(argv), bundle))

    @property
    def env_reads(self) -> list[Path]:
        return sorted(set(self.envs.values()))

    def attempt_dir(self, attempt_id: str) -> Path:
        w = self.root / "attempts" / attempt_id
        (w / "tmp").mkdir(parents=True)
        (w / "home").mkdir()
        return w

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def op_env(node: NodeDirs, service: str) -> dict[str, str]:
    """The environment of every service op (contract section 2): these and nothing else."""
    return environments.op_env(
        module=node.module_id, service=service, node_id=node.node_id, platform=platform_token(),
        data_dir=node.data, settings_file=node.settings_file, limits_file=node.limits_file,
        tools_file=node.tools_file)


@dataclass
class OpResult:
    op: str
    pid: int  # also the process group id: each op runs in its own group
    rc: int | None  # None: timed out (the group was killed)
    doc: dict | None  # the last stdout line that parses as a JSON object
    stdout: str
    stderr: str
    elapsed_s: float

    @property
    def timed_out(self) -> bool:
        return self.rc is None

    def tail(self, n: int = 300) -> str:
        """The end of stderr (or stdout), for a failure line."""
        text = (self.stderr.strip() or self.stdout.strip()).replace("\n", " | ")
        return text[-n:]


def _output_file(prefix: Path | None, suffix: str):
    if prefix is None:
        return tempfile.TemporaryFile()
    return open(f"{prefix}{suffix}", "w+b")  # noqa: SIM115 (returned as a context manager)


def run_op(
    argv: list[str],
    op: str,
    env: dict[str, str],
    cwd: str | Path,
    timeout_s: float,
    inherit: tuple[int, ...] = (),
    kill_group_on_timeout: bool = True,
    output_prefix: Path | None = None,
) -> OpResult:
    """Run ``argv + [op]`` in a new process group; wait for the op itself (not for what it
    leaves running). stdout/stderr go to files, not pipes: a daemon that inherits them must
    not keep us waiting for an end of file. With ``output_prefix`` the files are kept as
    ``<prefix>.out`` / ``<prefix>.err`` (what a daemon writes there later can be read too).
    ``inherit``: the handles the op gets (passed the transport's way)."""
    with _output_file(output_prefix, ".out") as out, _output_file(output_prefix, ".err") as err:
        t0 = time.monotonic()
        proc = spawn(  # its own process group, like the agent
            [*argv, op],
            cwd=str(cwd),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            **_transport.current().inheritable_kwargs(*inherit),
        )
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
            if kill_group_on_timeout:
                end_group(proc.pid, grace_s=0)
            proc.kill()
            proc.wait()
        elapsed = time.monotonic() - t0
        _release_if_empty(proc.pid)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    return OpResult(op, proc.pid, rc, last_json_object(stdout), stdout, stderr, elapsed)


WINDOWS = sys.platform == "win32"
# Windows: a group's leader pid -> its job object, until ``end_group``.
_jobs: dict[int, winjob.JobObject] = {}


def spawn(argv: list[str], job: winjob.JobObject | None = None,
          **popen: object) -> subprocess.Popen:
    """``argv`` in a new process group, as the agent starts ops, daemons and runners: POSIX
    its own session; Windows a job object (``job``, or a new one) that ``group_pids`` and
    ``end_group`` know by the leader's pid."""
    if not WINDOWS:
        return subprocess.Popen(argv, start_new_session=True, **popen)  # type: ignore[call-overload]
    job = job or winjob.JobObject()
    try:
        proc = winjob.start_in_job(argv, job, **popen)
    except BaseException:
        job.close()
        raise
    _jobs[proc.pid] = job
    return proc


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid`` (Windows: of the job object
    whose leader was ``pgid``)."""
    if WINDOWS:
        job = _jobs.get(pgid)
        return job.pids() if job is not None else []
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(p.pid) == pgid:
                found.append(p.pid)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return found


def end_group(pgid: int, grace_s: float = 2.0) -> list[int]:
    """SIGTERM the group, wait up to ``grace_s``, then SIGKILL what is left. Returns the pids
    that had to be killed. Windows has no signal to ask a job's processes to exit (nor does
    its agent send one): what is left is ended at once, with the job object."""
    if WINDOWS:
        return _end_job(pgid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = group_pids(pgid)
    if left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while group_pids(pgid) and time.monotonic() < deadline:
            time.sleep(0.02)
    return left


def _release_if_empty(pgid: int) -> None:
    """Windows: an op whose job object holds nothing now (it left no daemon) lets it go;
    nothing can join an empty job, so ``group_pids`` rightly says [] from here on."""
    job = _jobs.get(pgid)
    if job is not None and not job.pids():
        del _jobs[pgid]
        job.close()


def _end_job(pgid: int) -> list[int]:
    job = _jobs.pop(pgid, None)
    if job is None:
        return []
    left = job.pids()
    if left:
        job.terminate()
        deadline = time.monotonic() + 5
        while job.pids() and time.monotonic() < deadline:
            time.sleep(0.02)
    job.close()
    return left


@dataclass
class Attempt:
    """What the runner of one attempt leaves behind."""

    attempt_id: str
    workdir: Path
    rc: int | None
    result: dict | None = None
    failure: dict | None = None
    stderr: str = ""
    connects: int = 0
    refusals: list[str] = field(default_factory=list)


def runner_env(
    node: NodeDirs,
    attempt_id: str,
    workdir: Path,
    pools: dict[str, int],
    connectors: dict[str, Connector],
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The runner's environment (contract section 4): these and nothing else, plus the
    manifest's ``[runner].env``."""
    return environments.runner_env(
        module=node.module_id, attempt_id=attempt_id, workdir=workdir, data_dir=node.data,
        platform=platform_token(), settings_file=node.settings_file, pools=pools,
        manifest_env=extra, connectors={s: c.env_value for s, c in connectors.items()})


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def run_runner(
    argv: list[str],
    node: NodeDirs,
    attempt_id: str,
    stage: str,
    payload: object,
    pools: dict[str, int],
    connectors: dict[str, Connector],
    cwd: str | Path,
    timeout_s: float,
    extra_env: dict[str, str] | None = None,
    grace_s: float = 2.0,
    *,
    spec_extra: dict[str, Any] | None = None,
    prepare: Callable[[Path], None] | None = None,
    events: bool = False,
) -> Attempt:
    """One attempt: spec.json, the runner in its own process group with the connectors
    inherited, wait (``timeout_s``), end the group, collect result.json / failure.json.
    The caller closes the connectors and sends ``ended``. ``spec_extra``: more keys of
    spec.json (``datasets``, ``mounts``); ``prepare(workdir)`` runs before the runner starts
    (to place mounted files); ``events``: pass ``--events <W>/events.ndjson``."""
    w = node.attempt_dir(attempt_id)
    spec = {"job_id": f"job-{attempt_id}", "attempt_id": attempt_id, "stage": stage,
            "payload": payload, **(spec_extra or {})}
    (w / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    if prepare is not None:
        prepare(w)
    env = runner_env(node, attempt_id, w, pools, connectors, extra_env)
    fds = tuple(c.child_fd for c in connectors.values() if c.child_fd is not None)
    cmd = [*argv, "run", "--spec", str(w / "spec.json"), "--workdir", str(w),
           "--out", str(w / "result.json")]
    if events:
        cmd += ["--events", str(w / "events.ndjson")]
    # Windows: the job object first, so each connector can tell the attempt's pids (bad_pid)
    # from its first connect on.
    job = winjob.JobObject() if WINDOWS else None
    for c in connectors.values():
        c.job = job
    with open(w / "runner.log", "wb") as log:
        proc = spawn(cmd, job=job, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL,
                     stdout=log, stderr=log, **_transport.current().inheritable_kwargs(*fds))
    for c in connectors.values():
        c.close_child_end()  # only the runner holds them now
    try:
        rc: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        rc = None
    end_group(proc.pid, grace_s=grace_s)  # the attempt is over: nothing of it may stay
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    stderr = (w / "runner.log").read_text(encoding="utf-8", errors="replace")
    return Attempt(
        attempt_id, w, rc,
        result=_read_json(w / "result.json") if rc == 0 else None,
        failure=_read_json(w / "failure.json"),
        stderr=stderr,
        connects=sum(c.connects for c in connectors.values()),
        refusals=[r for c in connectors.values() for r in c.refusals],
    )
