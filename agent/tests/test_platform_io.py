"""The backend's control plane and I/O parts (``platform.api``: ``Streams``, ``Endpoint``,
``StateDirHost``, ``Requests``, ``Loops``), on this system's backend and under the darwin
profile (``OARBANK_PLATFORM=darwin``: the POSIX path with macOS's calls only)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from oarbank_agent import platform
from oarbank_agent.platform.api import EndpointPathTooLong

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the POSIX backends")


def test_a_pipe_is_not_inherited_and_is_watched_until_eof() -> None:
    streams = platform.current().streams
    r, w = streams.pipe()
    assert not os.get_inheritable(r) and not os.get_inheritable(w)
    os.set_blocking(r, False)
    got: list[bytes] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        io = streams.watcher(loop)
        done = loop.create_future()

        def readable(fd: int) -> None:
            chunk = os.read(fd, 100)
            got.append(chunk)
            if not chunk:
                assert io.off_readable(fd)
                done.set_result(None)

        io.on_readable(r, readable, r)
        os.write(w, b"one")
        deadline = loop.time() + 5
        while not got:  # the first read, before the end
            assert loop.time() < deadline, "the readable watch never fired"
            await asyncio.sleep(0.01)
        os.close(w)
        await asyncio.wait_for(done, 5)
        assert not io.off_readable(r)  # no longer watched

    platform.current().loops.run(main())
    os.close(r)
    assert got == [b"one", b""]


def test_writable_watch_fires_and_stops() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    assert isinstance(a, platform.current().streams.kind)

    async def main() -> int:
        io = platform.current().streams.watcher(asyncio.get_running_loop())
        calls = []
        io.on_writable(a, calls.append, 1)
        deadline = asyncio.get_running_loop().time() + 5
        while not calls:
            assert asyncio.get_running_loop().time() < deadline, "the writable watch never fired"
            await asyncio.sleep(0.01)
        assert io.off_writable(a)
        n = len(calls)
        # The socket stays writable: a watch still in place would fire at each turn of the loop.
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(calls) == n
        return n

    try:
        assert platform.current().loops.run(main()) >= 1
    finally:
        a.close()
        b.close()


def test_the_endpoint_is_owner_only_replaces_a_stale_one_and_answers(tmp_path: Path) -> None:
    endpoint = platform.current().endpoint
    path = tmp_path / "control.sock"
    path.write_text("stale")
    missing = tmp_path / "nothing.sock"
    with pytest.raises(FileNotFoundError):
        endpoint.connect(missing, 5)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    async def main() -> bytes:
        server = await endpoint.serve(path, echo, limit=1 << 16)
        try:
            assert stat.S_ISSOCK(os.stat(path).st_mode)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

            def client() -> bytes:
                with endpoint.connect(path, 5) as sock:
                    sock.sendall(b"hello\n")
                    return sock.makefile("rb").readline()

            got = await asyncio.to_thread(client)
            reader, writer = await endpoint.open(str(path))
            writer.write(b"again\n")
            assert await reader.readline() == b"again\n"
            writer.close()
            return got
        finally:
            server.close()
            await server.wait_closed()

    assert platform.current().loops.run(main()) == b"hello\n"


def test_the_state_dir_lock_is_one_holder_at_a_time(tmp_path: Path) -> None:
    host = platform.current().statedir
    lock = tmp_path / "agent.lock"
    first = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    second = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    try:
        assert host.try_lock(first)
        assert not host.try_lock(second)
        os.close(first)
        first = -1
        assert host.try_lock(second)  # closing the holder's descriptor let it go
    finally:
        for fd in (first, second):
            if fd >= 0:
                os.close(fd)
    with pytest.raises(OSError):
        host.try_lock(123456)  # not a descriptor: an error, not "held"
    old = os.umask(0o027)
    try:
        assert host.umask() == 0o027 and os.umask(0o027) == 0o027
    finally:
        os.umask(old)
    assert host.user_name(os.geteuid())
    assert host.user_name(2**31 - 7) is None


def test_stop_and_reload_requests_reach_their_callbacks() -> None:
    requests = platform.current().requests
    assert requests.stop_how and requests.reload_how
    seen: list[tuple[str, str]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        requests.install(loop, lambda why: seen.append(("stop", why)),
                         lambda why: seen.append(("reload", why)))
        try:
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                os.kill(os.getpid(), sig)
                for _ in range(100):
                    await asyncio.sleep(0.01)
                    if len(seen) == [signal.SIGHUP, signal.SIGTERM, signal.SIGINT].index(sig) + 1:
                        break
        finally:
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    platform.current().loops.run(main())
    assert seen == [("reload", "SIGHUP"), ("stop", "SIGTERM"), ("stop", "SIGINT")]


@pytest.mark.parametrize("which", ["chosen", "posix"])
def test_the_factory_host_reads_a_footprint_and_sees_a_process_end(which: str) -> None:
    from oarbank_agent.platform.posix.factoryhost import PosixFactoryHost

    host = platform.current().factory if which == "chosen" else PosixFactoryHost()
    rep = host.footprint(os.getpid())
    assert rep["rss_bytes"] > 0 and rep["fds"] >= 3
    assert host.footprint(2**22 + 12345) == {}  # no such process: nothing to say
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    async def main() -> None:
        waiting = asyncio.ensure_future(host.until_gone(child.pid))
        # The window: 0.2 s, four rounds of the posix host's 50 ms poll (pidfd's answer is at
        # once): a live child taken for gone would have ended the wait by then.
        await asyncio.sleep(0.2)
        assert not waiting.done()
        child.kill()  # not reaped yet: a zombie counts as gone
        await asyncio.wait_for(waiting, 10)

    try:
        platform.current().loops.run(main())
    finally:
        child.kill()
        child.wait()
    platform.current().loops.run(asyncio.wait_for(host.until_gone(child.pid), 10))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the darwin profile is Linux's")
def test_under_the_darwin_profile_the_parts_use_only_what_macos_has(tmp_path: Path) -> None:
    """A pipe without ``pipe2``, the umask without ``/proc``, the lock, the endpoint (a deep
    path refused, not shortened through ``/proc``): the tripwire fails any Linux-only call."""
    script = textwrap.dedent("""
        import asyncio, os, sys
        from pathlib import Path
        from oarbank_agent import platform
        from oarbank_agent.platform.api import EndpointPathTooLong
        b = platform.current()
        assert b.name == "darwin" and not hasattr(os, "pipe2")
        r, w = b.streams.pipe()
        assert not os.get_inheritable(r) and not os.get_inheritable(w)
        os.umask(0o077)
        assert b.statedir.umask() == 0o077
        tmp = Path(sys.argv[1])
        fd = os.open(tmp / "agent.lock", os.O_RDWR | os.O_CREAT, 0o600)
        assert b.statedir.try_lock(fd)
        deep = tmp / ("d" * 120) / "control.sock"
        try:
            b.endpoint.check(deep)
        except EndpointPathTooLong:
            pass
        else:
            raise AssertionError("a deep path was not refused")

        async def main():
            async def client(reader, writer):
                writer.close()
            server = await b.endpoint.serve(tmp / "c.sock", client, limit=1024)
            b.endpoint.connect(tmp / "c.sock", 5).close()
            server.close()
        b.loops.run(main())
        assert b.factory.footprint(os.getpid())["fds"] >= 3
        print("ok")
    """)
    env = dict(os.environ, OARBANK_PLATFORM="darwin")
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_path_too_long_for_any_address_is_refused_naming_it(tmp_path: Path) -> None:
    name = "n" * 200 + ".sock"  # the name alone is over every limit
    with pytest.raises(EndpointPathTooLong, match="--state-dir"):
        platform.current().endpoint.check(tmp_path / name)


def test_a_session_started_is_its_own_and_ends_whole() -> None:
    import psutil

    sessions = platform.current().sessions
    proc = sessions.start([sys.executable, "-c", "import subprocess, sys, time; "
                           "g = subprocess.Popen([sys.executable, '-c', 'import time; "
                           "time.sleep(60)']); print(g.pid, flush=True); time.sleep(60)"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)  # a session of its own
        sessions.kill_session(proc.pid)
        assert proc.wait(10) == -signal.SIGKILL
        for _ in range(200):  # the grandchild: gone, or a zombie its new parent has not reaped
            try:
                if psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the grandchild outlived kill_session")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
