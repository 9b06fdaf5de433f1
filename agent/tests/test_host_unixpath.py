"""A state dir deeper than a unix socket address allows (108 bytes on Linux): the agent binds
its control socket through the directory's descriptor, and `submit` / `status` reach it the
same way. Where that shortcut does not exist, `run` refuses with the path and the limit."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from oarbank_agent import platform
from oarbank_agent.operate import cli, control
from oarbank_agent.platform.posix import unixpath


def _deep(root: Path, at_least: int = 160) -> Path:
    d = root
    while len(str(d / control.SOCKET_NAME)) <= at_least:
        d = d / ("deep-" + "x" * 20)
    return d / "state"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_agent", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.skipif(platform.name() != "linux", reason="the /proc/self/fd shortcut is the "
                    "Linux backend's; elsewhere the refusal below is what a user gets")
def test_agent_with_a_state_dir_deeper_than_a_socket_address_just_works(
        start_agent, tmp_path: Path, echo_module: Path) -> None:
    state = _deep(tmp_path)
    sock = state / control.SOCKET_NAME
    assert len(os.fsencode(str(sock))) > unixpath.SUN_PATH_MAX
    agent = start_agent([echo_module], state_dir=state)
    assert f"control={sock}" in agent.proc.ready_line
    # The socket is in the real directory, private, and the fd the agent bound through is
    # gone (nothing under /proc/<agent>/fd names the state dir itself).
    assert stat.S_ISSOCK(os.stat(sock).st_mode)
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    held = [name.split("=", 1)[1] for name in agent.fd_names()]
    assert str(state) not in held, held

    # The command line a user runs, on the long path: a job through the endpoint service.
    r = _cli("submit", "--state-dir", str(state), "--module", "echo", "--stage", "echo",
             "--payload", '{"n": 2}', "--wait", "--timeout", "60")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["state"] == "succeeded"
    r = _cli("status", "--state-dir", str(state), "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["state_dir"] == str(state) and len(st["jobs"]) == 1
    agent.stop()  # clean exit: the socket is removed from the real directory
    assert not sock.exists()


def test_without_the_shortcut_run_refuses_naming_the_path_and_limit(
        tmp_path: Path, echo_module: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Fake: a platform without /proc/self/fd (macOS, the BSDs) cannot be had on this machine,
    # so the shortcut is pointed at a folder that does not exist.
    monkeypatch.setattr(unixpath, "_PROC_FD", str(tmp_path / "no-proc"))
    state = _deep(tmp_path)
    rc = cli.main(["run", "--state-dir", str(state), "--module", str(echo_module)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert str(state / control.SOCKET_NAME) in err
    assert f"at most {unixpath.SUN_PATH_MAX - 1}" in err and "--state-dir" in err
    assert not state.exists()  # refused before anything was created
    with pytest.raises(unixpath.SocketPathTooLong), control.Client(state):
        pass
    # A short path is used as it is, shortcut or not.
    with unixpath.socket_address(tmp_path / "s.sock") as address:
        assert address == str(tmp_path / "s.sock")
