"""The Windows backend's control plane: the proactor loop, the control pipe (serve, connect,
open, check), the state-dir lock, stop requests, sessions in job objects.

Windows only (but the pure parts, which run everywhere): under Wine with Windows' own CPython
(``nox -s windows -- -q agent/tests/test_windows_controlplane.py``; harness/tests/test_wine.py
runs it from the Linux suite) and on real Windows in the ``windows-latest`` workflow job. Real
pipes, real processes, real job objects and locks.

Wine does not show, so these tests cannot either: another user refused by the pipe's DACL, or
a pipe of another owner refused by the client (one user per prefix); console control events
(Wine gives its programs no console unless started on a terminal, and even on one its
``GenerateConsoleCtrlEvent`` to a process group fails with ERROR_INVALID_HANDLE; so under
Wine the test checks the fallback, the session ended, and on Windows the drain itself);
Windows' mandatory byte-range locks (Wine lets another handle read a locked byte, so the
lock's offset beyond the pid is checked only on Windows).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from oarbank_agent.platform.windows.endpoint import (
    MAX_PATH_CHARS,
    owner_trusted,
    path_problem,
    pipe_name,
)

windows = pytest.mark.skipif(
    sys.platform != "win32",
    reason="the Windows control plane: run under Wine by `nox -s windows`, or on Windows")

if sys.platform == "win32":
    import _winapi

    from oarbank_agent.platform.api import EndpointPathTooLong
    from oarbank_agent.platform.windows import controlpipe, winapi
    from oarbank_agent.platform.windows.endpoint import PipeEndpoint, read_record
    from oarbank_agent.platform.windows.loops import ProactorLoops
    from oarbank_agent.platform.windows.requests import ConsoleRequests
    from oarbank_agent.platform.windows.sessions import WindowsSessions
    from oarbank_agent.platform.windows.statedir import WindowsStateDir

SYNCHRONIZE = 0x00100000


# -- pure: the pipe's name and the path limit (every system) ------------------------------------


def test_the_pipe_name_says_which_state_dir_and_is_not_guessable_from_it() -> None:
    a = pipe_name(Path("C:/srv/oarbank/state"), "0" * 32)
    assert re.fullmatch(r"\\\\\.\\pipe\\oarbank-agent-[0-9a-f]{16}-0{32}", a), a
    assert len(a) <= 256  # a pipe name's limit
    same = pipe_name(Path("C:/srv/oarbank/state"), "f" * 32)
    other = pipe_name(Path("C:/srv/oarbank/other"), "0" * 32)
    assert a[:-32] == same[:-32] and a != same  # the path part is the path's, the rest random
    assert a[:-32] != other[:-32]


def test_a_record_path_over_max_path_is_refused_naming_the_limit_unless_long_paths() -> None:
    ok = Path("C:/" + "d" * (MAX_PATH_CHARS - 3))
    assert path_problem(ok, long_paths=False) is None
    long = Path(str(ok) + "x")
    problem = path_problem(long, long_paths=False)
    assert problem and f"{MAX_PATH_CHARS}" in problem and "--state-dir" in problem
    assert path_problem(long, long_paths=True) is None


def test_a_client_trusts_a_pipe_of_its_own_user_system_or_the_administrators_only() -> None:
    """What refuses a pipe another user made under the recorded name (Wine has one user, so
    only this decision is shown here; the windows-latest job has one user too)."""
    me, other = "S-1-5-21-1-2-3-1001", "S-1-5-21-1-2-3-1002"
    for owner in (me, "SY", "BA", "S-1-5-18", "S-1-5-32-544"):
        assert owner_trusted(owner, me), owner
    for owner in (other, "WD", "S-1-1-0", "BU", ""):  # another user, Everyone, Users
        assert not owner_trusted(owner, me), owner


# -- the event loop --------------------------------------------------------------------------------


@windows
def test_the_loop_is_the_proactor_and_runs_subprocesses() -> None:
    loops = ProactorLoops()
    loop = loops.new()
    try:
        assert type(loop).__name__ == "ProactorEventLoop"
    finally:
        loop.close()

    async def main() -> tuple[str, bytes]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "print('hi')", stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        return type(asyncio.get_running_loop()).__name__, out.strip()

    assert loops.run(main()) == ("ProactorEventLoop", b"hi")


# -- the control endpoint --------------------------------------------------------------------------


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while line := await reader.readline():
        writer.write(line)
        await writer.drain()
    writer.close()


@windows
def test_the_control_pipe_serves_many_clients_each_instance_owner_only(tmp_path: Path) -> None:
    endpoint = PipeEndpoint()
    path = tmp_path / "control.sock"
    path.write_text("stale")  # an agent that died: replaced
    sid = controlpipe.user_sid()

    def client(word: bytes) -> tuple[bytes, str, str]:
        with endpoint.connect(path, 10) as conn:
            handle = conn.fileno()
            dacl, owner = controlpipe.dacl_of(handle), controlpipe.owner_of(handle)
            conn.sendall(word + b"\n")
            return conn.makefile("rb").readline(), dacl, owner

    async def main() -> None:
        server = await endpoint.serve(path, _echo, limit=1 << 16)
        try:
            name = read_record(path)
            assert name.startswith("\\\\.\\pipe\\oarbank-agent-")
            # Several at once: each takes an instance, made after the one before was taken.
            words = [b"one", b"two", b"three", b"four"]
            got = await asyncio.gather(*(asyncio.to_thread(client, w) for w in words))
            for word, (line, dacl, owner) in zip(words, got, strict=True):
                assert line == word + b"\n"
                assert dacl.startswith("D:P"), dacl  # protected: nothing inherited
                trustees = sorted(ace.split(";")[-1] for ace in re.findall(r"\(([^)]*)\)", dacl))
                assert trustees == sorted([sid, "BA", "SY"]), dacl
                assert owner == sid
            reader, writer = await endpoint.open(str(path))  # the stream side (heartbeat's)
            writer.write(b"again\n")
            assert await reader.readline() == b"again\n"
            writer.close()
            reader, writer = await endpoint.open(name)  # or the pipe's name itself
            writer.write(b"named\n")
            assert await reader.readline() == b"named\n"
            writer.close()
        finally:
            server.close()
            await server.wait_closed()
        assert not server.is_serving()
        # The record stays (the agent's ControlServer removes it), nothing serves it now.
        with pytest.raises(ConnectionRefusedError, match="gone"):
            await asyncio.to_thread(endpoint.connect, path, 5)

    ProactorLoops().run(main())


@windows
def test_connect_says_what_is_there(tmp_path: Path) -> None:
    endpoint = PipeEndpoint()
    with pytest.raises(FileNotFoundError):
        endpoint.connect(tmp_path / "control.sock", 5)  # no agent ever ran here
    (tmp_path / "control.sock").write_text("not a pipe name\n")
    with pytest.raises(ConnectionRefusedError, match="records no agent's control pipe"):
        endpoint.connect(tmp_path / "control.sock", 5)
    (tmp_path / "control.sock").write_text(pipe_name(tmp_path, "a" * 32) + "\n")
    with pytest.raises(ConnectionRefusedError, match="gone"):
        endpoint.connect(tmp_path / "control.sock", 5)
    deep = tmp_path / ("d" * 260) / "control.sock"
    if not winapi.long_paths():
        with pytest.raises(EndpointPathTooLong, match="--state-dir"):
            endpoint.check(deep)


@windows
def test_a_read_on_the_control_pipe_times_out(tmp_path: Path) -> None:
    endpoint = PipeEndpoint()
    path = tmp_path / "control.sock"
    hold = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await hold.wait()
        writer.close()

    async def main() -> float:
        server = await endpoint.serve(path, silent, limit=1024)
        try:
            def call() -> float:
                with endpoint.connect(path, 0.3) as conn:
                    conn.sendall(b"{}\n")
                    t = time.monotonic()
                    with pytest.raises(TimeoutError):
                        conn.makefile("rb").readline()
                    return time.monotonic() - t

            return await asyncio.to_thread(call)
        finally:
            hold.set()
            server.close()
            await server.wait_closed()

    assert ProactorLoops().run(main()) >= 0.25


# -- the state-dir lock ----------------------------------------------------------------------------

HOLDER = r"""
import os, sys
from oarbank_agent.platform.windows.statedir import WindowsStateDir
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
print(WindowsStateDir().try_lock(fd), flush=True)
sys.stdin.readline()
"""


@windows
def test_the_state_dir_lock_is_one_holder_at_a_time_and_dies_with_it(tmp_path: Path) -> None:
    host = WindowsStateDir()
    lock = tmp_path / "agent.lock"
    first = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    second = os.open(lock, os.O_RDWR)
    try:
        assert host.try_lock(first)
        os.write(first, b"1234\n")
        assert not host.try_lock(second)
        os.lseek(second, 0, os.SEEK_SET)
        assert os.read(second, 64) == b"1234\n"  # the pid stays readable to another agent
        os.close(first)
        first = -1
        assert host.try_lock(second)  # closing the holder's descriptor let it go
    finally:
        for fd in (first, second):
            if fd >= 0:
                os.close(fd)
    with pytest.raises(OSError):
        host.try_lock(123456)  # not a descriptor: an error, not "held"

    # Another process: refused while we hold it; a holder killed lets it go.
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"True"
        fd = os.open(lock, os.O_RDWR)
        try:
            assert not host.try_lock(fd)
            holder.kill()  # TerminateProcess: the kernel closes its handle, and the lock goes
            holder.wait(10)
            for _ in range(100):
                if host.try_lock(fd):
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("a killed holder kept agent.lock")
        finally:
            os.close(fd)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate()
    old = os.umask(0o027)
    try:
        assert host.umask() == 0o027 and os.umask(0o027) == 0o027
    finally:
        os.umask(old)
    assert host.user_name(0) is None  # Windows names users by SID: no uid has a name


# -- stop requests ---------------------------------------------------------------------------------


@windows
def test_ctrl_c_and_ctrl_break_reach_on_stop_on_the_loop() -> None:
    requests = ConsoleRequests()
    assert requests.stop_how == "Ctrl-Break" and "reload" in requests.reload_how
    seen: list[tuple[str, str, bool]] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGBREAK)}

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def on_stop(why: str) -> None:  # called on the loop's thread, from its queue
            seen.append(("stop", why, threading.current_thread() is threading.main_thread()))

        requests.install(loop, on_stop, lambda why: seen.append(("reload", why, True)))
        for n, sig in enumerate((signal.SIGINT, signal.SIGBREAK), 1):
            signal.raise_signal(sig)  # the C runtime's raise: what a console event does
            for _ in range(100):
                await asyncio.sleep(0.01)
                if len(seen) == n:
                    break

    try:
        ProactorLoops().run(main())
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    assert seen == [("stop", "SIGINT", True), ("stop", "SIGBREAK", True)]


# -- sessions --------------------------------------------------------------------------------------

PARENT = r"""
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(g.pid, flush=True)
time.sleep(120)
"""
DRAINS = r"""
import asyncio, sys
from oarbank_agent.platform.windows.loops import ProactorLoops
from oarbank_agent.platform.windows.requests import ConsoleRequests

async def main():
    stop = asyncio.Event()
    ConsoleRequests().install(asyncio.get_running_loop(), lambda why: (print(why, flush=True),
                              stop.set()), print)
    print("ready", flush=True)
    await asyncio.wait_for(stop.wait(), 60)

ProactorLoops().run(main())
"""


def _under_wine() -> bool:
    import ctypes

    return hasattr(ctypes.WinDLL("ntdll"), "wine_get_version")


def _gone_within(pid: int, s: float = 10) -> bool:
    try:
        h = _winapi.OpenProcess(SYNCHRONIZE, False, pid)
    except OSError:
        return True
    try:
        return _winapi.WaitForSingleObject(h, int(s * 1000)) == 0
    finally:
        _winapi.CloseHandle(h)


@windows
def test_kill_session_ends_the_leader_and_what_it_started() -> None:
    sessions = WindowsSessions()
    proc = sessions.start([sys.executable, "-c", PARENT], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        sessions.kill_session(proc.pid)
        assert proc.wait(10) is not None
        assert _gone_within(grandchild), "the grandchild outlived its session"
        sessions.kill_session(proc.pid)  # gone already is fine
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             **sessions.popen_options())
    sessions.kill_session(plain.pid)  # not started in a job: the leader alone
    assert plain.wait(10) == 1


@windows
def test_ask_to_stop_drains_where_a_console_joins_us_else_ends_the_session() -> None:
    sessions = WindowsSessions()
    proc = sessions.start([sys.executable, "-c", DRAINS], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        sessions.ask_to_stop(proc)
        out, err = proc.communicate(timeout=30)
        if winapi.has_console() and not _under_wine():
            assert out.split() == [b"SIGBREAK"] and proc.returncode == 0, err
        else:  # no console, or Wine's: nothing polite reaches it, and it is ended
            assert out == b"" and proc.returncode == 1, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


STARTER = r"""
import subprocess, sys, time
from oarbank_agent.platform.windows.sessions import WindowsSessions
s = WindowsSessions()
for stop in (True, False):
    p = s.start([sys.executable, "-c", "import time; time.sleep(120)"], stop_with_parent=stop,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    print(p.pid, flush=True)
time.sleep(120)
"""


@windows
def test_a_session_started_to_stop_with_its_parent_ends_when_the_parent_dies() -> None:
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE)
    kept = None
    try:
        assert starter.stdout is not None
        with_parent, kept = (int(starter.stdout.readline()) for _ in range(2))
        starter.kill()  # no cleanup of its own: the kernel closes its job handles
        starter.wait(10)
        assert _gone_within(with_parent), "stop_with_parent: it outlived its starter"
        assert not _gone_within(kept, 1), "without stop_with_parent it outlives its starter"
    finally:
        if starter.poll() is None:
            starter.kill()
        starter.communicate()
        if kept is not None:
            WindowsSessions().kill_session(kept)


@windows
def test_the_agents_control_server_and_client_run_over_the_pipe_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``operate/control.py`` as the agent runs it, on this endpoint alone (the test gives
    ``platform.current()`` only what ControlServer and Client ask of it)."""
    import types

    from oarbank_agent import platform
    from oarbank_agent.operate import control

    monkeypatch.setattr(platform, "_backend", types.SimpleNamespace(endpoint=PipeEndpoint()))

    async def handler(req: dict) -> dict:
        if req.get("op") == "boom":
            raise control.ControlError("bad_request", "no such op")
        return {"ok": True, "echo": req}

    async def main() -> None:
        server = control.ControlServer(tmp_path / control.SOCKET_NAME, handler)
        await server.start()
        try:
            def calls() -> list[dict]:
                # one that comes and goes without a word: the next is served all the same
                endpoint = platform.current().endpoint
                endpoint.connect(tmp_path / control.SOCKET_NAME, 5).close()
                with control.Client(tmp_path, timeout=10) as c:
                    return [c.call({"op": "status"}), c.call({"op": "boom"}),
                            control.request(tmp_path, {"op": "again"})]

            first, refused, again = await asyncio.to_thread(calls)
            assert first == {"ok": True, "echo": {"op": "status"}}
            assert refused == {"ok": False, "code": "bad_request", "error": "no such op"}
            assert again["echo"] == {"op": "again"}
        finally:
            await server.close()
        assert not (tmp_path / control.SOCKET_NAME).exists()  # the record goes with it
        with pytest.raises(control.AgentNotRunning):
            control.request(tmp_path, {"op": "status"})

    ProactorLoops().run(main())
