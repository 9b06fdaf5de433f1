"""``--keep-services``: an endpoint service outlives its agent (its channel held by the keeper)
and the next agent on the same state dir takes it back only when it is provably the same; the
model is not loaded again. Without the flag, the contract's rule: it is stopped and started
anew. Real agents, real daemons, real descriptors; no orphan (the keeper exits)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from agent_helpers import EXAMPLE, alive, end_leftovers, processes_referencing, read_jsonl, write_module

from oarbank_agent.keep.keeper import SOCKET_NAME
from testsupport.privilege import require_root

KEEP = ["--keep-services"]


@pytest.fixture(autouse=True)
def no_orphans(tmp_path: Path) -> Iterator[None]:
    """Every process of the test (daemons, the keeper) is gone at its end; a failing test's
    are ended here so they do not outlive it."""
    yield
    left = end_leftovers(tmp_path)
    assert not left, "left behind:\n" + "\n".join(left)


def hellos(agent: Any) -> list[int]:
    return [e["pid"] for e in read_jsonl(agent.module_data() / "events.jsonl")
            if e["event"] == "hello"]


def runs(agent: Any) -> list[dict[str, Any]]:
    return read_jsonl(agent.module_data() / "runs.jsonl")


def loads(agent: Any) -> list[str]:
    path = agent.module_data() / "loads"
    return path.read_text().split() if path.exists() else []


def keepers(tmp_path: Path) -> list[int]:
    return [int(line.split(":", 1)[0]) for line in processes_referencing(tmp_path)
            if "oarbank_agent.keep" in line]


def wait_kept(agent: Any) -> None:
    """Until the agent's keeper holds the service's channel (the keeper says so)."""
    log = agent.state_dir / "keeper.log"
    agent.wait_for(lambda: log.exists() and "keeps the channel end of" in log.read_text(),
                   what="the keeper to hold the channel")


def served_by(agent: Any) -> set[int]:
    job = agent.run_job("echo", {"requests": 2})
    assert job["state"] == "succeeded", agent.why(job)
    return set(job["result"]["payload"]["pids"])


def sigterm(agent: Any) -> None:
    """Stop the agent as an operator does; what it leaves running is the point here."""
    agent.stopped = True
    assert agent.proc.stop() == 0, agent.log()[-3000:]


def end_with_a_plain_agent(start_agent: Any, mod: Path, first: Any, tmp_path: Path,
                           settings: dict[str, Any]) -> Any:
    """The last agent runs without the flag: it takes what the keeper holds and stops it."""
    last = start_agent([mod], settings, state_dir=first.state_dir)
    last.stop()
    assert not keepers(tmp_path)
    return last


def test_kill_9_the_service_stays_warm_and_serves_the_next_agent(start_agent,
                                                                tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    settings = {"echo": {"load_s": 0.3}}
    first = start_agent([mod], settings, extra_args=KEEP)
    before = served_by(first)
    (daemon,) = hellos(first)
    assert before == {daemon} and loads(first) == [str(daemon)]
    wait_kept(first)
    # A job at work when the agent dies: its attempt is given back, the next one is served
    # by the same daemon.
    job = first.submit("echo", {"requests": 2, "sleep_s": 30.0, "sleep_below_attempt": 2})
    # Its own sleep: every runner records one (the served_by job's with sleep_s 0), and a
    # kill before this job's runner started left nothing to give back (flaky: 2 runs in 4).
    first.wait_for(lambda: any(r["event"] == "sleep" and str(r["attempt"]).startswith(job)
                               for r in runs(first)), what="the job's runner at work")
    first.kill()
    # The gap: no agent runs; the daemon and the keeper do.
    time.sleep(1.0)
    assert alive(daemon) and len(keepers(tmp_path)) == 1
    second = start_agent([mod], settings, state_dir=first.state_dir, extra_args=KEEP)
    rec = second.wait(job)
    assert rec["state"] == "succeeded", second.why(rec)
    assert set(rec["result"]["payload"]["pids"]) == {daemon}
    on_disk = json.loads((second.state_dir / "jobs" / job / "job.json").read_text())
    assert (on_disk["attempts"], on_disk["released"]) == (1, 1), on_disk
    row = second.service_row()
    assert (row["ready"], row["running"]) == (True, True), row
    assert served_by(second) == {daemon}
    assert loads(second) == [str(daemon)], "the model was loaded again"
    assert hellos(second) == [daemon]
    log = second.log()
    assert "taken back after the agent restart: the same process" in log, log[-3000:]
    # The old keeper handed over and exited; the second agent owns a new one.
    second.wait_for(lambda: len(keepers(tmp_path)) == 1, what="one keeper, the new one")
    second.kill()
    end_with_a_plain_agent(start_agent, mod, first, tmp_path, settings)
    assert not alive(daemon)


def test_sigterm_and_start_keeps_it_too_and_so_does_the_config_key(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    settings = {"echo": {"load_s": 0.3}}
    first = start_agent([mod], settings, extra_args=KEEP)
    (daemon,) = served_by(first)
    wait_kept(first)
    sigterm(first)
    assert alive(daemon), first.log()[-2000:]
    assert "left running for the next agent" in first.log()
    cfg = tmp_path / "agent.toml"  # the config key, as an operator sets it for good
    cfg.write_text("keep_services = true\n")
    second = start_agent([mod], settings, state_dir=first.state_dir,
                         extra_args=["--config", str(cfg)])
    assert served_by(second) == {daemon}
    assert loads(second) == [str(daemon)]
    sigterm(second)
    end_with_a_plain_agent(start_agent, mod, first, tmp_path, settings)
    assert not alive(daemon)


def test_changed_settings_stop_the_kept_service_at_readoption(start_agent,
                                                             tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    first = start_agent([mod], {"echo": {"load_s": 0.3}}, extra_args=KEEP)
    (daemon,) = served_by(first)
    wait_kept(first)
    first.kill()
    changed = {"echo": {"load_s": 0.3, "slots": 3}}
    second = start_agent([mod], changed, state_dir=first.state_dir, extra_args=KEEP)
    # Stopped at re-adoption, before anything could use it: not later.
    assert not alive(daemon)
    assert "kept across the agent restart, now stopped: its settings changed" in second.log()
    (new,) = served_by(second)
    assert new != daemon and loads(second) == [str(daemon), str(new)]
    second.kill()
    end_with_a_plain_agent(start_agent, mod, first, tmp_path, changed)


def test_without_the_flag_the_contracts_rule(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    settings = {"echo": {"load_s": 0.3}}
    first = start_agent([mod], settings)
    (daemon,) = served_by(first)
    assert not keepers(tmp_path)
    first.kill()
    second = start_agent([mod], settings, state_dir=first.state_dir)
    (new,) = served_by(second)
    assert new != daemon and not alive(daemon)
    assert loads(second) == [str(daemon), str(new)]


def test_kept_then_flag_off_stops_it_and_the_keeper_exits(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    settings = {"echo": {"load_s": 0.3}}
    first = start_agent([mod], settings, extra_args=KEEP)
    (daemon,) = served_by(first)
    wait_kept(first)
    first.kill()
    second = start_agent([mod], settings, state_dir=first.state_dir)
    assert not alive(daemon) and not keepers(tmp_path)
    assert ("kept across the agent restart, now stopped: this agent runs without "
            "--keep-services") in second.log()
    (new,) = served_by(second)
    assert new != daemon


def test_the_keeper_serves_only_its_user_and_state_dir(start_agent, tmp_path: Path) -> None:
    """Another state dir's agent is refused; the socket is its user's alone (mode 0600)."""
    from oarbank_agent import platform

    mod = write_module(tmp_path / "m")
    first = start_agent([mod], {}, extra_args=KEEP)
    served_by(first)
    wait_kept(first)
    path = first.state_dir / SOCKET_NAME
    assert (path.stat().st_mode & 0o777) == 0o600
    host = platform.current().keeper
    assert host is not None
    first.kill()
    sock = host.connect(path, 5.0)
    assert sock is not None
    with sock:
        host.send(sock, {"op": "take", "state_dir": str(tmp_path / "elsewhere")})
        reply, fds = host.recv(sock)
    assert fds == [] and reply["ok"] is False and "this keeper is for" in reply["why"]
    sock = host.connect(path, 5.0)
    assert sock is not None
    with sock:  # the right state dir, without the lock file's descriptor
        host.send(sock, {"op": "take", "state_dir": str(first.state_dir)})
        reply, fds = host.recv(sock)
    assert fds == [] and reply == {"ok": False, "why": "no proof of this state dir's lock"}
    assert psutil.pid_exists(keepers(tmp_path)[0])  # still holding, for the right agent
    end_with_a_plain_agent(start_agent, mod, first, tmp_path, {})


@pytest.mark.linux_only("the peer's uid comes from SO_PEERCRED; the darwin profile on Linux "
                        "cannot ask it the macOS way (the lock-file proof stands there)")
def test_another_user_is_refused_even_when_the_socket_lets_it_in(start_agent,
                                                                 tmp_path: Path) -> None:
    require_root("connects to the keeper as another user")
    mod = write_module(tmp_path / "m")
    first = start_agent([mod], {}, extra_args=KEEP)
    served_by(first)
    wait_kept(first)
    path = first.state_dir / SOCKET_NAME
    first.kill()
    os.chmod(path, 0o666)  # as if the mode were lost: the kernel's word on the peer remains
    os.chmod(first.state_dir, 0o711)
    # From inside the state dir (the folders above it are root's alone), then as nobody.
    script = ("import os, socket\n"
              "os.setgid(65534); os.setuid(65534)\n"
              f"s = socket.socket(socket.AF_UNIX); s.connect({SOCKET_NAME!r})\n"
              "print(repr(s.recv(100)))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=30, cwd=first.state_dir)
    os.chmod(first.state_dir, 0o700)
    assert out.stdout.strip() == "b''", out  # closed on it, nothing said
    log = (first.state_dir / "keeper.log").read_text()
    assert "refused a connection of uid 65534" in log, log
    end_with_a_plain_agent(start_agent, mod, first, tmp_path, {})


def test_the_idle_clock_goes_on_from_where_the_dead_agent_left_it(start_agent,
                                                                   tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"idle_timeout_s": 30})
    first = start_agent([mod], {}, extra_args=KEEP)
    (daemon,) = served_by(first)
    idle_from = time.time()  # the job is over: no users from here on
    wait_kept(first)
    first.kill()
    time.sleep(2.0)  # the input: a gap with no agent, which the idle clock must count
    second = start_agent([mod], {}, state_dir=first.state_dir, extra_args=KEEP)
    (row,) = [r for r in second.status()["services"] if r["service"] == "echo"]
    # A clock started at the adoption would say about 30 s; this one lost the gap too.
    assert row["ready"] and row["idle_stop_in_s"] is not None, row
    assert row["idle_stop_in_s"] <= 30 - (time.time() - idle_from) + 0.5, row
    second.kill()
    end_with_a_plain_agent(start_agent, mod, first, tmp_path, {})
    assert not alive(daemon)


def test_a_new_module_version_stops_the_kept_service_at_readoption(start_agent,
                                                                  tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    first = start_agent([mod], {}, extra_args=KEEP)
    (daemon,) = served_by(first)
    wait_kept(first)
    first.kill()
    toml = mod / "oarbank-module.toml"
    toml.write_text(toml.read_text().replace('version = "0.0.1"', 'version = "0.0.2"'))
    second = start_agent([mod], {}, state_dir=first.state_dir, extra_args=KEEP)
    assert not alive(daemon)
    assert ("now stopped: its module's version changed (0.0.1 -> 0.0.2)") in second.log()
    (new,) = served_by(second)
    assert new != daemon
    second.kill()
    end_with_a_plain_agent(start_agent, mod, first, tmp_path, {})


def test_a_daemon_that_logs_to_stderr_keeps_serving_and_logging(start_agent,
                                                                tmp_path: Path) -> None:
    """The example writes a line to stderr (its service log, a pipe the agent reads) per
    request: the keeper holds that pipe too, or the daemon's first line after the agent died
    would be a broken pipe and its requests would fail."""
    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    settings = {"modelserver": {"load_s": 0.1}}
    first = start_agent([mod], settings, extra_args=KEEP)
    job = first.run_job("generate", {"prompts": ["a"]}, module="modelserver")
    assert job["state"] == "succeeded", first.why(job)
    (pid,) = job["result"]["provenance"]["service_pids"]
    wait_kept(first)
    first.kill()
    second = start_agent([mod], settings, state_dir=first.state_dir, extra_args=KEEP)
    job = second.run_job("generate", {"prompts": ["b", "c"]}, module="modelserver")
    assert job["state"] == "succeeded", second.why(job)
    assert job["result"]["provenance"]["service_pids"] == [pid]
    log = second.state_dir / "modules" / "dev.example.modelserver" / "logs" / "model.log"
    second.wait_for(lambda: log.read_text().count("POST /v1/generate") == 3,
                    what="each request's line in the service log")
    second.kill()
    end_with_a_plain_agent(start_agent, mod, first, tmp_path, settings)
    assert not alive(pid)


def test_a_kept_service_that_dies_after_it_is_taken_back_is_seen_and_restarted(
        start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    first = start_agent([mod], {}, extra_args=KEEP)
    (daemon,) = served_by(first)
    wait_kept(first)
    first.kill()
    second = start_agent([mod], {}, state_dir=first.state_dir, extra_args=KEEP)
    assert served_by(second) == {daemon}
    os.kill(daemon, signal.SIGKILL)
    second.wait_for(lambda: not second.service_row()["ready"], what="the death to be seen")
    (new,) = served_by(second)
    assert new != daemon
    assert "the service closed its channel" in second.log()
    second.kill()
    end_with_a_plain_agent(start_agent, mod, first, tmp_path, {})
    assert not alive(new)
