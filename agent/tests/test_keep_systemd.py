"""``--keep-services`` under systemd: the agent speaks the service manager's protocol itself
(``platform/linux/servicemanager.py``, ``keep/fdstore.py``): ``READY=1`` once its control
socket answers, ``STOPPING=1`` when it drains, each kept service's channel end, log pipe and
record in the descriptor store, taken back from ``LISTEN_FDS`` at the next start.

systemd itself cannot run here, so this test plays its receiving end, and says so: a real
``AF_UNIX`` datagram socket as ``$NOTIFY_SOCKET`` (abstract, as systemd's own), real
descriptors passed with SCM_RIGHTS into a store the test holds, and the next agent started
the way systemd starts one (the stored descriptors at fd 3 on, ``LISTEN_PID``,
``LISTEN_FDS``, ``LISTEN_FDNAMES``). The agents, daemons and channels are real. Under a real
systemd unit: the harness's VM backend (``agent-upgrade``).
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import alive, end_leftovers, processes_referencing, write_module

from oarbank_agent.operate import control
from oarbank_agent.platform.linux.servicemanager import parse_handed_back

pytestmark = pytest.mark.linux_only("systemd's protocol: the Linux backend's (memfd for the "
                                    "records)")

# What systemd does between fork and exec: the stored descriptors at 3.., the variables.
LAUNCH = """
import fcntl, os, sys
fds = [int(x) for x in sys.argv[1].split(",") if x]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
for fd in fds:
    os.close(fd)
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i)
    os.close(fd)
if fds:
    os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS=str(len(fds)),
                      LISTEN_FDNAMES=sys.argv[2])
os.execv(sys.executable, [sys.executable, "-m", "oarbank_agent", *sys.argv[3:]])
"""


class PlayedSystemd:
    """systemd's end of the notify socket and its descriptor store (name -> fds)."""

    def __init__(self) -> None:
        self.address = f"@oarbank-test-notify-{os.getpid()}-{time.monotonic_ns()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + self.address[1:].encode())
        self.store: dict[str, list[int]] = {}
        self.heard: list[dict[str, str]] = []

    def _one(self, timeout: float) -> dict[str, str] | None:
        self.sock.settimeout(timeout)
        try:
            data, anc, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(16 * 4))
        except TimeoutError:
            return None
        fds: list[int] = []
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(raw[: len(raw) - len(raw) % a.itemsize])
                fds += list(a)
        fields = dict(line.split("=", 1) for line in data.decode().splitlines() if line)
        if fields.get("FDSTORE") == "1":
            self.store.setdefault(fields.get("FDNAME", "stored"), []).extend(fds)
        else:
            for fd in fds:  # systemd closes what it was not asked to store
                os.close(fd)
            if fields.get("FDSTOREREMOVE") == "1":
                for fd in self.store.pop(fields["FDNAME"], []):
                    os.close(fd)
        self.heard.append(fields)
        return fields

    def wait_for(self, pred: Any, what: str, timeout: float = 60) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            msg = self._one(left)
            if msg is not None and pred(msg):
                return msg
        raise AssertionError(f"no {what} within {timeout} s; heard {self.heard}")

    def drain(self, quiet_s: float = 0.5) -> None:
        while self._one(quiet_s) is not None:
            pass

    def names(self) -> list[str]:
        return sorted(self.store)

    def close(self) -> None:
        for fds in self.store.values():
            for fd in fds:
                os.close(fd)
        self.store.clear()
        self.sock.close()


class UnitAgent:
    """An agent started the way systemd starts one (its own session, stopped at the end)."""

    def __init__(self, root: Path, state: Path, mod: Path, settings: Path, sd: PlayedSystemd,
                 *flags: str, hand_back: bool = True) -> None:
        names, fds = [], []
        for name, stored in (sd.store.items() if hand_back else ()):
            for fd in stored:
                names.append(name)
                fds.append(fd)
        argv = ["run", "--state-dir", str(state), "--node-id", "unit-node", "--drain-s", "2",
                "--module", str(mod), "--settings", f"echo={settings}", *flags]
        env = dict(os.environ, NOTIFY_SOCKET=sd.address)
        root.mkdir(parents=True, exist_ok=True)
        self.log_path = root / "agent.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", LAUNCH, ",".join(map(str, fds)), ":".join(names), *argv],
                pass_fds=fds, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True)
        self.state = state

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def job(self, payload: dict[str, Any]) -> dict[str, Any]:
        reply = control.request(self.state, {"op": "submit", "module": "echo",
                                             "stage": "echo", "payload": payload})
        assert reply["ok"], reply
        done = control.request(self.state, {"op": "wait", "job_id": reply["job_id"],
                                            "timeout": 120}, timeout=130)
        assert done["ok"] and done["job"]["state"] == "succeeded", (done, self.log()[-3000:])
        return dict(done["job"])

    def served_by(self) -> set[int]:
        return set(self.job({"requests": 2})["result"]["payload"]["pids"])

    def end(self, sig: int) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        return self.proc.wait(60)


@pytest.fixture
def played(tmp_path: Path) -> Iterator[PlayedSystemd]:
    sd = PlayedSystemd()
    yield sd
    sd.close()
    left = end_leftovers(tmp_path)
    assert not left, "left behind:\n" + "\n".join(left)


def test_handed_back_descriptors_are_named_for_this_process_only() -> None:
    env = {"LISTEN_PID": "42", "LISTEN_FDS": "3", "LISTEN_FDNAMES": "a:b"}
    assert parse_handed_back(env, 42) == [("a", 3), ("b", 4), ("unknown", 5)]
    assert parse_handed_back(env, 43) == []  # another process's (a parent's, inherited)
    assert parse_handed_back({"LISTEN_PID": "42", "LISTEN_FDS": "x"}, 42) == []
    assert parse_handed_back({}, 42) == []


def test_ready_fdstore_and_readoption_under_a_played_systemd(played: PlayedSystemd,
                                                              tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    settings = tmp_path / "settings-echo.json"
    settings.write_text(json.dumps({"load_s": 0.3}))
    state = tmp_path / "state"
    first = UnitAgent(tmp_path / "a1", state, mod, settings, played, "--keep-services")
    played.wait_for(lambda m: m.get("READY") == "1", "READY=1")
    # READY once the control socket answers: asked right away, it does.
    assert control.request(state, {"op": "status"})["ok"]
    (daemon,) = first.served_by()
    played.wait_for(lambda m: m.get("FDNAME", "").endswith(".rec"), "the record stored")
    played.drain()
    stems = {n.rsplit(".", 1)[0] for n in played.names()}
    parts = {n.rsplit(".", 1)[1] for n in played.names()}
    # its channel end and record (and the read end of its stderr pipe, when it has one)
    assert len(stems) == 1 and {"end", "rec"} <= parts <= {"end", "log", "rec"}, played.names()
    (stem,) = stems
    (rec_fd,) = played.store[f"{stem}.rec"]
    rec = json.loads(os.pread(rec_fd, 65536, 0))
    assert rec["pid"] == daemon and rec["key"] == "test.agent.echo/echo", rec
    # No keeper process under systemd: the store holds the ends.
    assert not [p for p in processes_referencing(tmp_path) if "oarbank_agent.keep" in p]

    # A crash: the store (here, the test) holds the channel; the daemon runs on.
    assert first.end(signal.SIGKILL) == -signal.SIGKILL
    time.sleep(0.5)  # the input: a gap with no agent (the second one takes the daemon back)
    assert alive(daemon)
    second = UnitAgent(tmp_path / "a2", state, mod, settings, played, "--keep-services")
    played.wait_for(lambda m: m.get("READY") == "1", "READY=1 from the second agent")
    assert second.served_by() == {daemon}
    loads = (state / "modules" / "test.agent.echo" / "data" / "loads").read_text().split()
    assert loads == [str(daemon)], "the model was loaded again"
    assert "taken back after the agent restart: the same process" in second.log()
    # It took the old copies out of the store and stored what it keeps again.
    played.drain()
    assert {n.rsplit(".", 1)[1] for n in played.names()} == parts, played.names()
    assert any(m.get("FDSTOREREMOVE") == "1" for m in played.heard)

    # SIGTERM (systemctl stop / restart): STOPPING=1, the kept service left running.
    assert second.end(signal.SIGTERM) == 0, second.log()[-3000:]
    played.wait_for(lambda m: m.get("STOPPING") == "1", "STOPPING=1", timeout=5)
    played.drain()
    assert alive(daemon) and played.store, second.log()[-3000:]

    # Without the flag, the contract's rule: the handed-back service is stopped.
    third = UnitAgent(tmp_path / "a3", state, mod, settings, played)
    played.wait_for(lambda m: m.get("READY") == "1", "READY=1 from the third agent")
    deadline = time.monotonic() + 30
    while alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(daemon), third.log()[-3000:]
    assert "now stopped: this agent runs without --keep-services" in third.log()
    played.drain()
    assert not played.store, played.names()  # nothing of it is kept any more
    (new,) = third.served_by()
    assert new != daemon
    assert third.end(signal.SIGTERM) == 0
