"""The process factory (``--process-factory on``) against the direct path (``off``).

The same probe runner (modfiles/factory_probe.py) runs under two real agents, one each way,
with the real sandbox and containment of this machine; what it reports of itself must be
identical (argv, environment, /proc cmdline and environ, cwd, sys.path, sys.flags, stdio,
descriptors, rlimits, umask, signal dispositions and mask, session and group, cgroup, sandbox
status), and so must how jobs end (exit codes, signals, a command that cannot be exec'd). The
only differences allowed are the paths and ids of the two agents' state dirs, and the probe's
own ``in_factory`` (which must say the factory ran it in place, or the comparison proves
nothing). A module that bundles its own libraries (our SDK's name among them) gets its copies
both ways, never the factory's. Then: a factory killed under a running job: the job is released
and run again, the agent carries on with a new factory, and nothing is left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import MODFILES, RunningAgent, alive, read_jsonl, write_module  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the process factory is Linux only (off elsewhere)")
MODULE = "test.agent.echo"


def _probe_module(root: Path, runner_exec: list[str] | None = None) -> Path:
    mod = write_module(root, runner={"exec": runner_exec or
                                     ["python", "-I", "{bundle}/factory_probe.py"]},
                       stages=[{"name": "plain", "timeout_s": 120}])
    shutil.copy(MODFILES / "factory_probe.py", mod / "factory_probe.py")
    _settle(mod / "factory_probe.py")
    return mod


def _settle(path: Path) -> None:
    """Times a bundle's files have once installed: the factory keeps a script's compiled code
    only once the file has settled (scriptcache.SETTLE_S)."""
    old = time.time() - 3600
    os.utime(path, (old, old))


def _report(agent: RunningAgent, job: dict[str, Any], attempt: int = 1) -> dict[str, Any]:
    path = agent.state_dir / "jobs" / job["job_id"] / f"a{attempt}" / "probe.json"
    text = path.read_text().replace(str(agent.root), "<agent>").replace(job["job_id"], "<job>")
    return json.loads(text)


def _outcome(job: dict[str, Any]) -> tuple[Any, ...]:
    reason = str(job.get("reason") or "")
    return job["state"], job.get("exit_code"), reason.replace(job["job_id"], "<job>")


def _diff(on: dict[str, Any], off: dict[str, Any]) -> list[str]:
    out = []
    for key in sorted(set(on) | set(off)):
        if on.get(key) != off.get(key):
            out.append(f"{key}:\n  on:  {on.get(key)!r}\n  off: {off.get(key)!r}")
    return out


def _both(start_agent: Callable[..., RunningAgent], mod: Path,
          *extra: str) -> dict[str, RunningAgent]:
    return {mode: start_agent([mod], extra_args=["--process-factory", mode, *extra])
            for mode in ("on", "off")}


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_the_same_runner_cannot_tell_the_factory_from_a_direct_start(
        tmp_path: Path, start_agent: Callable[..., RunningAgent], sandbox: str) -> None:
    agents = _both(start_agent, _probe_module(tmp_path / "mod"), "--sandbox", sandbox)
    assert agents["on"].status()["process_factory"]["pid"], agents["on"].status()
    assert agents["off"].status()["process_factory"]["mode"] == "off"
    reports, outcomes = {}, {}
    for mode, agent in agents.items():
        job = agent.run_job("plain", {}, module=MODULE)
        outcomes[mode] = _outcome(job)
        reports[mode] = _report(agent, job)
    assert outcomes["on"] == outcomes["off"] == ("succeeded", 0, "")
    # Run in place by the factory (its modules already loaded), exec'd by the direct path.
    assert reports["on"].pop("in_factory") is True
    assert reports["off"].pop("in_factory") is False
    assert not _diff(reports["on"], reports["off"]), "\n".join(_diff(reports["on"],
                                                                     reports["off"]))
    # The runner's doctor and the job ran the same script: the factory compiled it once, and
    # this second job runs that code (scriptcache.py). What the probe sees must not change.
    on = agents["on"]
    again = on.run_job("plain", {}, module=MODULE)
    assert _outcome(again) == outcomes["on"]
    assert on.status()["process_factory"]["scripts_from_cache"] >= 1, on.status()
    cached = _report(on, again)
    assert cached.pop("in_factory") is True
    assert not _diff(cached, reports["off"]), "\n".join(_diff(cached, reports["off"]))
    # And the probe saw a real start: its own session, cgroup and (where enforced) sandbox.
    rep = reports["on"]
    assert rep["session"] == [True, True]
    assert rep["fds"]["0"].startswith("/dev/null")
    if agents["on"].status()["sandbox"]["mode"] != "off" and \
            agents["on"].status()["sandbox"]["endpoints"] == "enforced":
        assert rep["status"]["NoNewPrivs"] == "1" and rep["status"]["Seccomp"] == "2"


def test_an_agent_started_under_nohup_gives_both_the_same_signals(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    """``nohup oarbank-agent run`` (SIGHUP ignored when the agent starts): the agent then
    handles SIGHUP itself (reload), so a direct child gets it at its default; the factory,
    started before that handler was set, must not pass its inherited ignore on (CI, run under
    nohup, found exactly that)."""
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        agents = _both(start_agent, _probe_module(tmp_path / "mod"))
    finally:
        signal.signal(signal.SIGHUP, old)
    seen = {}
    for mode, agent in agents.items():
        job = agent.run_job("plain", {}, module=MODULE)
        assert job["state"] == "succeeded", job
        rep = _report(agent, job)
        seen[mode] = (rep["signals"], rep["status"]["SigIgn"])
    assert seen["on"] == seen["off"], seen
    assert seen["on"][0][str(int(signal.SIGHUP))] == "0", "SIGHUP must be at its default"


def test_an_execd_runner_cannot_tell_either(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    """A shell runner: exec'd both ways (not run in place), with the same sandbox, signal
    dispositions, descriptors, limits and environment."""
    mod = _probe_module(tmp_path / "mod", ["{bundle}/factory_probe.sh"])
    shutil.copy(MODFILES / "factory_probe.sh", mod / "factory_probe.sh")
    agents = _both(start_agent, mod)
    seen = {}
    for mode, agent in agents.items():
        job = agent.run_job("plain", {}, module=MODULE)
        assert job["state"] == "succeeded", job
        text = (agent.state_dir / "jobs" / job["job_id"] / "a1" / "probe.txt").read_text()
        lines = text.replace(str(agent.root), "<agent>").replace(job["job_id"], "<job>")
        # the session line has the pid twice: same pid = sid = pgid, whatever its number
        seen[mode] = [ln if not ln.startswith("session: ") else
                      str(len(set(ln.replace("pid", "").split()[1:])) == 1)
                      for ln in lines.splitlines()]
    assert seen["on"] == seen["off"], "\n".join(
        f"on: {a!r}\noff: {b!r}" for a, b in zip(seen["on"], seen["off"], strict=False)
        if a != b)
    assert "True" in seen["on"]  # its own session and group


# A runner whose compilation warns, and which reports its VERSION: a fresh start prints the
# warning every time and runs the file as it is at that moment.
_WARNING_RUNNER = '''import json, sys
VERSION = {version}
if VERSION is 1:  # SyntaxWarning at compile time: '"is" with a literal'
    pass
args = sys.argv[1:]
if args[0] == "run":
    with open(args[args.index("--out") + 1], "w") as f:
        json.dump({{"envelope": 1, "payload": {{"version": VERSION}}}}, f)
'''


def test_a_runner_is_compiled_as_it_is_now_each_time_with_what_its_compile_says(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    """The factory keeps a script's compiled code for its next children (scriptcache.py):
    a script whose compilation warns is never kept (each run prints the warning, as a fresh
    start does), and a script changed between two jobs runs its new text."""
    mod = write_module(tmp_path / "mod", runner={"exec": ["python", "-I", "{bundle}/warns.py"]},
                       stages=[{"name": "plain", "timeout_s": 60}], with_service=False)
    script = mod / "warns.py"
    script.write_text(_WARNING_RUNNER.format(version=1))
    _settle(script)
    agents = _both(start_agent, mod)
    for mode, agent in agents.items():
        jobs = [agent.run_job("plain", {}, module=MODULE) for _ in range(2)]
        for job in jobs:
            assert job["state"] == "succeeded", agent.why(job)
            assert job["result"]["payload"] == {"version": 1}
            log = (agent.state_dir / "jobs" / job["job_id"] / "a1" / "runner.log").read_text()
            assert "SyntaxWarning" in log, (mode, log)
    assert agents["on"].status()["process_factory"]["scripts_from_cache"] == 0
    # Now a script that compiles silently, changed between jobs (same size: 1 -> 2).
    on = agents["on"]
    script.write_text(_WARNING_RUNNER.format(version=1).replace("VERSION is 1", "VERSION == 1"))
    _settle(script)
    assert on.run_job("plain", {}, module=MODULE)["result"]["payload"] == {"version": 1}
    assert on.run_job("plain", {}, module=MODULE)["result"]["payload"] == {"version": 1}
    from_cache = on.status()["process_factory"]["scripts_from_cache"]
    assert from_cache >= 1, on.status()
    script.write_text(_WARNING_RUNNER.format(version=2).replace("VERSION is 1", "VERSION == 1"))
    _settle(script)
    job = on.run_job("plain", {}, module=MODULE)
    assert job["result"]["payload"] == {"version": 2}, on.why(job)


@pytest.mark.parametrize("payload", [{"exit": 3}, {"exit": 75}, {"kill": int(signal.SIGTERM)},
                                     {"kill": int(signal.SIGKILL)}],
                         ids=["exit3", "exit75", "sigterm", "sigkill"])
def test_exit_codes_and_signals_end_jobs_alike(
        tmp_path: Path, start_agent: Callable[..., RunningAgent],
        payload: dict[str, Any]) -> None:
    agents = _both(start_agent, _probe_module(tmp_path / "mod"))
    outcomes = {mode: _outcome(a.run_job("plain", payload, module=MODULE))
                for mode, a in agents.items()}
    assert outcomes["on"] == outcomes["off"], outcomes
    assert outcomes["on"][0] == "failed"
    code = payload.get("exit", -payload.get("kill", 0))
    assert outcomes["on"][1] == code


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_a_command_that_cannot_be_run_fails_alike(
        tmp_path: Path, start_agent: Callable[..., RunningAgent], sandbox: str) -> None:
    """A runner that does not exist: its ``doctor --json`` (runnerhealth) fails the same
    way both ways (sandboxed: the launcher's exit 71 and its line; unsandboxed: Popen's
    FileNotFoundError). Unsandboxed under cgroups the direct path's entry shell would say
    it instead (exit 127): the factory still says what Popen says (agent/README.md)."""
    mod = _probe_module(tmp_path / "mod", ["{bundle}/no-such-runner"])
    agents = _both(start_agent, mod, "--sandbox", sandbox,
                   *(["--containment", "process-group"] if sandbox == "off" else []))
    health = {}
    for mode, agent in agents.items():
        agent.wait_for(lambda a=agent: a.status().get("runners", {}).get(MODULE, {}).get(
            "health") not in (None, "checking"), what="the runner's health checked")
        row = agent.status()["runners"][MODULE]
        health[mode] = (row["health"], row["reason"])
    assert health["on"] == health["off"], health
    assert "no-such-runner" in health["on"][1]


def test_services_ops_and_daemons_come_from_the_factory(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    """The echo module's start op, its daemon and the runner's connector, all through it."""
    agent = start_agent([write_module(tmp_path / "mod-echo")],
                        extra_args=["--process-factory", "on"])
    job = agent.run_job("echo", {"requests": 3})
    assert job["state"] == "succeeded", job
    row = agent.service_row()
    assert row["ready"] is True, row
    # The daemon was forked by the factory (then left by its start op, like any daemon).
    assert row.get("pid") and alive(row["pid"])


def _children_of(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(x) for x in f.read().split()}
    except OSError:
        return set()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_factory_killed_under_a_job_releases_it_and_the_job_runs_again(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    agent = start_agent([_probe_module(tmp_path / "mod")],
                        extra_args=["--process-factory", "on"])
    agent.run_job("plain", {}, module=MODULE)  # warm: the baseline has seen one job
    agent.wait_for(lambda: agent.status()["process_factory"].get("children") == 0,
                   what="no child in flight")
    baseline_fds = agent.fd_count()
    first = agent.status()["process_factory"]
    job_id = agent.submit("plain", {"first_attempt_sleep_s": 600}, module=MODULE)
    runner: list[int] = []

    def runner_started() -> bool:  # the factory's child that is this job's runner
        runner[:] = [pid for pid in _children_of(first["pid"]) if job_id in _cmdline(pid)]
        return bool(runner)

    agent.wait_for(runner_started, timeout=60, what="the runner forked by the factory")
    os.kill(first["pid"], signal.SIGKILL)
    job = agent.wait(job_id, timeout=120)
    assert job["state"] == "succeeded", agent.why(job)
    job = json.loads((agent.state_dir / "jobs" / job_id / "job.json").read_text())
    outcomes = [h["outcome"] for h in job["history"]]
    assert outcomes == ["released", "succeeded"], job["history"]
    assert "process factory died" in job["history"][0]["reason"]
    assert job["attempts"] == 1  # the released attempt is not charged
    # The orphaned runner was ended, the agent has a new factory and its old descriptors.
    agent.wait_for(lambda: not alive(runner[0]), what="the orphaned runner ended")
    now = agent.status()["process_factory"]
    assert now["pid"] != first["pid"] and now["restarts"] == first["restarts"] + 1
    assert not alive(first["pid"])
    agent.wait_fds_back(baseline_fds, timeout=30)
    assert agent.run_job("plain", {}, module=MODULE)["state"] == "succeeded"


def test_the_factory_ends_with_its_agent_stopped_or_killed(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    mod = _probe_module(tmp_path / "mod")
    stopped = start_agent([mod], extra_args=["--process-factory", "on"])
    killed = start_agent([mod], extra_args=["--process-factory", "on"])
    pids = {a: a.status()["process_factory"]["pid"] for a in (stopped, killed)}
    assert all(alive(p) for p in pids.values())
    stopped.stop()
    assert not alive(pids[stopped])  # reaped before the agent exited
    killed.kill()  # SIGKILL: nobody closes the factory, its socket's other end goes away
    killed.wait_for(lambda: not alive(pids[killed]), what="the factory of a killed agent ends")


_BUNDLED = {"oarbank_sdk/__init__.py": 'MARK = "bundled"\n__version__ = "0.0.0+bundled"\n',
            "oarbank_sdk/sandbox/__init__.py": 'MARK = "bundled"\n',
            "pyseccomp.py": 'MARK = "bundled"\n'}


@pytest.mark.parametrize("stdlib_name", [False, True], ids=["libraries", "and-a-stdlib-name"])
def test_a_modules_own_libraries_win_over_what_the_factory_holds(
        tmp_path: Path, start_agent: Callable[..., RunningAgent], stdlib_name: bool) -> None:
    """A module that bundles its own ``oarbank_sdk`` (a nested package too) and ``pyseccomp``
    next to its scripts (both of which the factory has imported for itself) gets its copies in
    every op, its daemon, the runner's doctor and run: factory on or off, the same files.
    ``and-a-stdlib-name``: it bundles a ``dataclasses`` too (a backport's name), which the
    factory holds as the standard library's: that module's scripts are exec'd, not run in
    place. Otherwise they run in place (the factory's speed is kept)."""
    probe = ["python", "-I", "{bundle}/bundled_libs.py"]
    mod = write_module(tmp_path / "mod", service={"exec": [*probe, "service"], "endpoint": False},
                       runner={"exec": [*probe, "runner"]})
    shutil.copy(MODFILES / "bundled_libs.py", mod / "bundled_libs.py")
    files = dict(_BUNDLED, **({"dataclasses.py": 'MARK = "bundled"\n'} if stdlib_name else {}))
    for name, text in files.items():
        (mod / name).parent.mkdir(parents=True, exist_ok=True)
        (mod / name).write_text(text)
    seen: dict[str, dict[str, Any]] = {}
    for mode, agent in _both(start_agent, mod).items():
        job = agent.run_job("echo", {}, module=MODULE)
        assert job["state"] == "succeeded", agent.why(job)
        agent.stop()  # its stop op too
        rows = [r for where in (agent.module_data(MODULE), agent.state_dir / "jobs" /
                                job["job_id"] / "a1", agent.state_dir / "run" / "doctor" / MODULE)
                for r in read_jsonl(where / "libs.jsonl")]  # ops + daemon, the run, the doctor
        seen[mode] = {r["what"]: r for r in rows}
    for mode, rows in seen.items():
        assert {"op fingerprint", "op start", "op ready", "op stop", "daemon", "runner doctor",
                "runner run"} <= set(rows), (mode, sorted(rows))
        for what, row in rows.items():
            for name, (mark, path) in row["libs"].items():
                bundled = name != "dataclasses" or stdlib_name
                assert (mark == "bundled") == bundled and path.startswith(str(mod)) == bundled, (
                    f"--process-factory {mode}: {what} imported {name} from {path}")
    assert {w: r["libs"] for w, r in seen["on"].items()} == \
        {w: r["libs"] for w, r in seen["off"].items()}
    # Whether the factory ran them in place (the daemon: exec'd by its op, both ways).
    assert not any(r["in_place"] for r in seen["off"].values())
    assert {w for w, r in seen["on"].items() if r["in_place"]} == (
        set() if stdlib_name else set(seen["on"]) - {"daemon"})
