"""Operating a node (issue 18): logs, the config file, the kept node id and settings, drain,
reload, status for an operator. Real agents, real signals, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent_helpers import RunningAgent, write_module

from oarbank_agent.operate.demo import AgentProcess
from testsupport.livefiles import read_jsonl

MOD = "test.agent.echo"
KEYS = {"time", "level", "event", "module", "service", "job", "attempt"}


def _lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(path.parent.glob(path.name + "*")):
        out += read_jsonl(p)  # the agent may be writing the last line
    return out


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_agent", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_json_log_file_a_clean_idle_stop_is_info(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "mod", service={"idle_timeout_s": 1})
    log = tmp_path / "log" / "agent.jsonl"
    a = start_agent([mod], extra_args=["--log-format", "json", "--log-file", str(log)])
    job = a.submit("echo", {"requests": 1})
    assert a.wait(job)["state"] == "succeeded"
    a.wait_for(lambda: a.service_row()["last_stop_reason"] == "idle", 30, "the idle stop")
    a.stop()
    lines = _lines(log)
    assert lines and all(set(line) >= KEYS for line in lines)
    # Nothing of a healthy run (start, job, idle stop, drain) asks an operator to act.
    assert [x["event"] for x in lines if x["level"] != "INFO"] == []
    stop = [x for x in lines if "ready -> stopping" in x["event"]]
    assert stop and stop[0]["module"] == MOD and stop[0]["service"] == "echo"
    assert stop[0]["event"].endswith(": idle")
    opened = [x for x in lines if x["event"].startswith("connector attempt=")]
    assert opened and opened[0]["job"] == job and opened[0]["attempt"] == 1
    assert any(x["event"].startswith("drain (SIGTERM)") for x in lines)
    assert a.log().strip() == ""  # nothing on stderr: the file has it all


def test_log_file_rotates_by_size(start_agent, tmp_path: Path, echo_module: Path) -> None:
    log = tmp_path / "agent.log"
    a = start_agent([echo_module], extra_args=["--log-file", str(log), "--log-max-mb", "0.002",
                                               "--log-backups", "2", "--log-level", "debug"])
    for _ in range(3):
        assert a.run_job("echo", {"requests": 2})["state"] == "succeeded"
    a.stop()
    files = sorted(p.name for p in tmp_path.glob("agent.log*"))
    assert files == ["agent.log", "agent.log.1", "agent.log.2"], files
    for name in files:  # each under the limit plus one line
        assert (tmp_path / name).stat().st_size < 0.002 * 2**20 + 1000


def test_bad_log_options_name_what_is_wrong(tmp_path: Path, echo_module: Path) -> None:
    r = _cli("run", "--state-dir", str(tmp_path / "s"), "--module", str(echo_module),
             "--log-file", "/proc/nope/agent.log")
    assert r.returncode == 2 and "--log-file /proc/nope/agent.log: cannot write it" in r.stderr
    r = _cli("run", "--state-dir", str(tmp_path / "s"), "--module", str(echo_module),
             "--log-backups", "0")
    assert r.returncode == 2 and "--log-backups 0: must be >= 1" in r.stderr


def _as_nobody(argv: list[str]) -> tuple[int, str]:
    """``oarbank-agent ARGV`` in a forked child that became uid/gid 65534 (no exec: that user
    may not read this interpreter's files, nor the checkout where it is private); its exit code
    and stderr."""
    # Loaded here, before the child loses the right to read this interpreter's files and the
    # checkout's: every module of the agent and SDK (the commands import theirs lazily) and what they
    # import lazily from the standard library (pwd; importlib.metadata, with email, for versions).
    import email.parser  # noqa: F401
    import importlib
    import importlib.metadata  # noqa: F401
    import pkgutil
    import pwd  # noqa: F401

    import oarbank_agent
    import oarbank_sdk
    from oarbank_agent.operate import cli

    for package in (oarbank_agent, oarbank_sdk):
        for found in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not found.name.endswith(".__main__"):  # a __main__ runs its command if imported
                importlib.import_module(found.name)

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, run the command, exit with its code
        code = 99
        try:
            os.close(r)
            sys.stderr = os.fdopen(w, "w")  # pytest's capture object is not our pipe
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            code = cli.main(argv)
        except BaseException:  # say what broke (the parent reads our stderr)
            import traceback

            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        err = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err


def _config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_config_file_flags_override_and_service_timings(tmp_path: Path) -> None:
    write_module(tmp_path / "mod", service={"idle_timeout_s": 600, "start_timeout_s": 10})
    (tmp_path / "etc").mkdir()
    cfg = _config(tmp_path / "etc" / "agent.toml", f"""
module = ["../mod"]            # relative to this file
node_id = "from-the-file"
heartbeat_s = 5
log_level = "info"

[settings.echo]
greeting = "hi"

[services."{MOD}/echo"]
idle_timeout_s = 1.5
start_timeout_s = 20
""")
    # RunningAgent gives --state-dir and --node-id test-node: the flag beats the file's id.
    a = RunningAgent(tmp_path / "a", [], {}, extra_args=["--config", str(cfg)])
    try:
        assert a.status()["node_id"] == "test-node"
        settings = a.state_dir / "modules" / MOD / "settings.json"
        assert json.loads(settings.read_text()) == {"greeting": "hi"}
        assert a.run_job("echo", {"requests": 1})["state"] == "succeeded"
        row = a.service_row()
        assert row["idle_timeout_s"] == 1.5
        a.wait_for(lambda: a.service_row()["last_stop_reason"] == "idle", 20, "idle stop")
        assert "timings idle_timeout_s=1.5 start_timeout_s=20" in a.log()
    finally:
        a.stop()


def test_config_errors_name_the_file_and_key(tmp_path: Path, echo_module: Path) -> None:
    cases = {
        "heartbeat = 5\n": "heartbeat: not a run option; did you mean 'heartbeat_s'?",
        "heartbeat_s = \"often\"\n": "argument --heartbeat-s: invalid float value: 'often'",
        "sandbox = \"maybe\"\n": "argument --sandbox: invalid choice: 'maybe'",
        "allow_empty = 1\n": "allow_empty = 1: expected true or false",
        "module = \"x\"\n": "module = 'x': expected a list",
        "[services.x]\nidle_timeout_s = 1\n": "services: 'x' is not a loaded service",
        f'[services."{MOD}/echo"]\nstart_timeout_s = 1\n':
            "start_timeout_s = 1: below the manifest's 10 (it may be raised, never lowered)",
        f'[services."{MOD}/echo"]\nidle_timeout_s = -1\n':
            "idle_timeout_s = -1: must be a number > 0",
        "state_dir = [\n": "not valid TOML",
    }
    for i, (text, expected) in enumerate(cases.items()):
        cfg = _config(tmp_path / f"c{i}.toml", text)
        r = _cli("run", "--config", str(cfg), "--state-dir", str(tmp_path / f"s{i}"),
                 "--module", str(echo_module), "--sandbox", "off")
        assert r.returncode == 2, (text, r.stderr)
        assert f"--config {cfg}" in r.stderr and expected in r.stderr, (text, r.stderr)
    r = _cli("run", "--module", str(echo_module))
    assert r.returncode == 2 and "--state-dir is required" in r.stderr


def test_settings_never_rewritten_by_a_restart(start_agent, tmp_path: Path,
                                               echo_module: Path) -> None:
    state = tmp_path / "state"
    a = start_agent([echo_module], {"echo": {"slots": 1}}, state_dir=state)
    a.stop()
    settings = state / "modules" / MOD / "settings.json"
    assert json.loads(settings.read_text()) == {"slots": 1}
    settings.write_text('{"slots": 2}\n')  # the operator's edit
    before = settings.stat().st_mtime_ns
    b = start_agent([echo_module], state_dir=state)  # no --settings this time
    assert b.run_job("echo", {"requests": 1})["state"] == "succeeded"
    b.stop()
    assert settings.read_text() == '{"slots": 2}\n' and settings.stat().st_mtime_ns == before


def test_node_id_is_kept_and_a_rename_must_be_asked(tmp_path: Path, echo_module: Path) -> None:
    state = tmp_path / "state"
    a = AgentProcess(state, [echo_module], node_id="node-a", log_path=tmp_path / "a.log")
    assert a.stop() == 0
    assert (state / "node_id").read_text() == "node-a\n"
    r = _cli("run", "--state-dir", str(state), "--module", str(echo_module),
             "--node-id", "node-b")
    assert r.returncode == 2
    assert "--node-id node-b: this state dir belongs to node node-a" in r.stderr
    assert "--rename-node" in r.stderr
    b = AgentProcess(state, [echo_module], node_id="node-b", log_path=tmp_path / "b.log",
                     extra_args=["--rename-node"])
    try:
        assert "node=node-b" in b.ready_line
    finally:
        assert b.stop() == 0
    assert (state / "node_id").read_text() == "node-b\n"


def test_sigterm_drains_a_running_attempt_to_its_end(start_agent, echo_module: Path) -> None:
    a = start_agent([echo_module], extra_args=["--drain-s", "30"])  # the default
    # 8 s: the drain must outlast a CLI's start on a loaded machine (with 3 s the agent had
    # finished before the first refused submit ran, at a load average of 30).
    job = a.submit("plain", {"sleep_s": 8})
    a.wait_for(lambda: a.status()["jobs"][0]["state"] == "running", 30, "running")
    t0 = time.monotonic()
    os.kill(a.pid, signal.SIGTERM)
    refused = None
    for _ in range(40):  # while it drains, a submit is refused
        try:
            refused = _cli("submit", "--state-dir", str(a.state_dir), "--module", "echo",
                           "--stage", "plain", "--payload", "{}")
        except subprocess.TimeoutExpired:
            continue
        if refused.returncode != 0:
            break
    assert a.proc.proc.wait(60) == 0
    rec = json.loads((a.state_dir / "jobs" / job / "job.json").read_text())
    assert rec["state"] == "succeeded" and rec["attempts"] == 1, rec
    assert time.monotonic() - t0 < 30
    assert refused is not None and "stopping" in refused.stderr
    log = a.log()
    assert "drain (SIGTERM): admitting nothing more; 1 attempt(s) running, 0 admitted; " \
        "waiting up to 30s" in log
    assert "drain: 1 job run(s) ended" in log and "exiting" in log
    a.stop()


def test_drain_releases_what_outlasts_drain_s_without_charge(start_agent,
                                                             echo_module: Path) -> None:
    a = start_agent([echo_module], extra_args=["--drain-s", "1"])
    job = a.submit("plain", {"sleep_s": 60})
    a.wait_for(lambda: a.status()["jobs"][0]["state"] == "running", 30, "running")
    r = _cli("drain", "--state-dir", str(a.state_dir))
    assert r.returncode == 0 and "up to 1s" in r.stdout
    assert a.proc.proc.wait(60) == 0
    rec = json.loads((a.state_dir / "jobs" / job / "job.json").read_text())
    assert rec["state"] == "queued" and rec["attempts"] == 0 and rec["released"] == 1, rec
    assert "1 still in flight: released (requeued, not charged)" in a.log()
    a.stop()


def test_sighup_reload_applies_idle_timeout_at_once(tmp_path: Path) -> None:
    mod = write_module(tmp_path / "mod", service={"idle_timeout_s": 600})
    cfg = _config(tmp_path / "agent.toml", f'module = ["{mod}"]\n'
                  f'[services."{MOD}/echo"]\nidle_timeout_s = 300\n')
    a = RunningAgent(tmp_path / "a", [], {}, extra_args=["--config", str(cfg)])
    try:
        assert a.run_job("echo", {"requests": 1})["state"] == "succeeded"
        row = a.service_row()
        assert row["running"] and 200 < row["idle_stop_in_s"] <= 300
        assert row["pid"] and row["uptime_s"] is not None
        cfg.write_text(f'module = ["{mod}"]\n[services."{MOD}/echo"]\nidle_timeout_s = 1\n'
                       "[settings.echo]\nslots = 3\n")
        os.kill(a.pid, signal.SIGHUP)
        a.wait_for(lambda: a.service_row()["last_stop_reason"] == "idle", 20,
                   "the idle stop under the reloaded timeout")
        settings = a.state_dir / "modules" / MOD / "settings.json"
        assert json.loads(settings.read_text()) == {"slots": 3}
        # The control command, with a bad value: refused, nothing changes.
        cfg.write_text(f'module = ["{mod}"]\n[services."{MOD}/echo"]\nstop_timeout_s = 1\n')
        r = _cli("reload", "--state-dir", str(a.state_dir))
        assert r.returncode == 2 and "below the manifest's 10" in r.stderr
        assert a.service_row()["idle_timeout_s"] == 1
        cfg.write_text(f'module = ["{mod}"]\nheartbeat_s = 3\n')
        r = _cli("reload", "--state-dir", str(a.state_dir))
        assert r.returncode == 0, r.stderr
        assert f"{MOD}/echo: idle_timeout_s 1 -> 600" in r.stdout
        assert "reload: --heartbeat-s changed; it takes effect only when the agent restarts" \
            in a.log()
    finally:
        a.stop()


def test_status_pages_jobs_and_exit_codes(start_agent, tmp_path: Path,
                                          echo_module: Path) -> None:
    a = start_agent([echo_module])
    ids = [a.submit("plain", {}) for _ in range(5)]
    for j in ids:
        a.wait(j)
    r = _cli("status", "--state-dir", str(a.state_dir), "--per-page", "2", "--json")
    st = json.loads(r.stdout)
    assert [j["job_id"] for j in st["jobs"]] == ids[3:]
    assert st["jobs_total"] == 5 and st["jobs_page"]["pages"] == 3
    r = _cli("status", "--state-dir", str(a.state_dir), "--per-page", "2", "--page", "3")
    assert ids[0] in r.stdout and ids[1] not in r.stdout and "jobs: 1 of 5 (page 3 of 3" \
        in r.stdout
    # Not permitted: another user (the state dir is 0700).
    if os.geteuid() == 0:
        sd = str(a.state_dir)
        for argv in (["status", "--state-dir", sd], ["drain", "--state-dir", sd],
                     ["reload", "--state-dir", sd], ["protect", "--state-dir", sd],
                     ["submit", "--state-dir", sd, "--module", "echo", "--stage", "plain",
                      "--payload", "{}"]):
            rc, err = _as_nobody(argv)
            assert rc == 3, (argv, err)
            assert "not permitted to reach the agent" in err and "run this command as" in err
        assert a.status()["jobs_total"] == 5  # nothing got through
    a.stop()
    r = _cli("status", "--state-dir", str(a.state_dir))
    assert r.returncode == 1 and "no agent is running with state dir" in r.stderr


CHATTY = """\
import json, os, subprocess, sys, time
op = sys.argv[1]
data = os.environ["OARBANK_MODULE_DATA"]
if op == "serve":  # the daemon: its stderr is the start op's, inherited
    for i in range(400):
        sys.stderr.write(f"daemon line {i:04d} " + "x" * 80 + "\\n")
        sys.stderr.flush()
    open(os.path.join(data, "done"), "w").close()
    time.sleep(3600)
elif op == "start":
    subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "serve"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    print(json.dumps({"ok": True}))
elif op == "ready":
    print(json.dumps({"ready": os.path.exists(os.path.join(data, "done"))}))
elif op == "fingerprint":
    print(json.dumps({"health": "healthy", "pools": {"chat": 1}, "running": False}))
else:
    print(json.dumps({"ok": True}))
"""


def test_daemon_stderr_is_collected_into_the_service_log_and_rotated(start_agent,
                                                                      tmp_path: Path) -> None:
    mod = write_module(tmp_path / "mod", service={
        "name": "chatty", "exec": ["python", "-I", "{bundle}/chatty.py"], "lifecycle": "always",
        "endpoint": False, "provides": {"pools": ["chat"]}}, stages=[{"name": "plain"}])
    (mod / "chatty.py").write_text(CHATTY)
    a = start_agent([mod], extra_args=["--log-max-mb", "0.01", "--log-backups", "3"])
    a.wait_for(lambda: a.service_row("chatty")["ready"], 60, "the chatty service ready")
    logs = a.state_dir / "modules" / MOD / "logs"
    a.wait_for(lambda: "daemon line 0399" in (logs / "chatty.log").read_text(), 30,
               "the daemon's last line in its log")
    a.stop()
    files = sorted(p.name for p in logs.glob("chatty.log*"))
    assert files == ["chatty.log", "chatty.log.1", "chatty.log.2", "chatty.log.3"], files
    for name in files:
        assert (logs / name).stat().st_size <= 0.01 * 2**20
    text = "".join((logs / n).read_text() for n in reversed(files[1:])) + \
        (logs / "chatty.log").read_text()
    kept = [int(x.split()[2]) for x in text.splitlines() if x.startswith("daemon line")]
    assert kept == list(range(kept[0], 400))  # the newest lines, in order, none lost or cut


def test_a_second_sigterm_ends_the_drain_at_once(start_agent, echo_module: Path) -> None:
    a = start_agent([echo_module], extra_args=["--drain-s", "120"])
    job = a.submit("plain", {"sleep_s": 120})
    a.wait_for(lambda: a.status()["jobs"][0]["state"] == "running", 30, "running")
    os.kill(a.pid, signal.SIGTERM)
    a.wait_for(lambda: "waiting up to 120s" in a.log(), 30, "the drain to begin")
    t0 = time.monotonic()
    os.kill(a.pid, signal.SIGTERM)
    assert a.proc.proc.wait(60) == 0
    assert time.monotonic() - t0 < 30
    assert "drain: asked again to stop: not waiting any longer" in a.log()
    rec = json.loads((a.state_dir / "jobs" / job / "job.json").read_text())
    assert rec["state"] == "queued" and rec["attempts"] == 0 and rec["released"] == 1, rec
    a.stop()


def test_heartbeat_rows_stay_the_contracts_status_adds_details(tmp_path: Path) -> None:
    from oarbank_agent.modules.loaded import ModuleCtx
    from oarbank_agent.services import lifecycle as lc
    from oarbank_agent.services.runtime import ServiceRuntime, details, row
    from oarbank_sdk import manifest as mf

    m = mf.load(write_module(tmp_path / "mod"))
    svc = m.services[0]
    rt = ServiceRuntime(f"{m.id}/{svc.name}", ModuleCtx(m, tmp_path / "state"), svc,
                        lc.ServiceState(svc.lifecycle, svc.idle_timeout_s, 1, 2, 3))
    contract = {"module", "service", "health", "running", "ready", "accepting", "error", "held",
                "disabled", "withdrawn", "gpu_api_missing", "lifecycle", "users", "endpoint"}
    additions = {"evicted_for"}  # docs/contract.md 6.2a: this project's one addition to a row
    assert set(row(rt)) == contract | additions  # what Agent.report (heartbeats) sends
    extra = details(rt, time.time())
    assert not set(extra) & contract
    assert extra["restarts"] == 0 and extra["idle_stop_in_s"] is None and extra["pid"] is None


def test_a_drain_starts_no_new_attempt(start_agent, echo_module: Path) -> None:
    a = start_agent([echo_module], extra_args=["--drain-s", "30"])
    # Attempt 1 sleeps 2 s, then exits 75 (transient): during a drain, no attempt 2.
    job = a.submit("plain", {"sleep_s": 2, "sleep_below_attempt": 2, "exit": 75,
                             "exit_below_attempt": 2})
    a.wait_for(lambda: a.status()["jobs"][0]["state"] == "running", 30, "running")
    os.kill(a.pid, signal.SIGTERM)
    assert a.proc.proc.wait(60) == 0
    rec = json.loads((a.state_dir / "jobs" / job / "job.json").read_text())
    assert rec["state"] == "queued" and rec["attempts"] == 1, rec
    assert [h["outcome"] for h in rec["history"]] == ["retry"], rec["history"]
    assert not (a.state_dir / "jobs" / job / "a2").exists()
    a.stop()


def test_an_agent_whose_starter_is_killed_stops_too(tmp_path: Path, echo_module: Path) -> None:
    """A demo or test run killed from outside (a timeout's SIGKILL) leaves no agent running:
    AgentProcess's agent gets SIGTERM when its starter dies, drains and ends what it started.
    (One was found still running two hours after a demo test's timeout.)"""
    starter = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from pathlib import Path\n"
         "from oarbank_agent.operate.demo import AgentProcess\n"
         "a = AgentProcess(Path(sys.argv[1]), [Path(sys.argv[2])], node_id='orphan-test',\n"
         "                 extra_args=['--drain-s', '2'])\n"
         "print(a.pid, flush=True)\n"
         "time.sleep(600)\n", str(tmp_path / "state"), str(echo_module)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout is not None
        pid = int(starter.stdout.readline())
        os.kill(pid, 0)  # running
        starter.kill()
        starter.wait(10)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            # a zombie until its parent (init, or a subreaper) reaps it also counts as gone
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.2)
        else:
            os.killpg(pid, signal.SIGKILL)
            raise AssertionError("the agent outlived its starter by 60 s")
        assert "stopped: every service and job process ended" in \
            (tmp_path / "agent.log").read_text()
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait(10)
        if starter.stdout is not None:
            starter.stdout.close()
