"""A process factory that cannot start: the client says why, and leaves no process or descriptor.

Real processes stand in for a broken factory: ``sys.executable`` is pointed at a shell script
(the client starts the factory as ``sys.executable -I -m oarbank_agent.platform.linux.factory ...``)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from oarbank_agent import platform
from oarbank_agent.platform.linux.factory import client as factory_client


def _fake_interpreter(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\n{body}\n")
    script.chmod(0o755)
    return str(script)


def _start(monkeypatch: pytest.MonkeyPatch, interpreter: str) -> str:
    monkeypatch.setattr(sys, "executable", interpreter)
    monkeypatch.setattr(factory_client, "_START_TIMEOUT_S", 1.0)

    async def go() -> str:
        fc = factory_client.FactoryClient(confine=False, backend=platform.current())
        with pytest.raises(OSError) as err:
            await fc.start()
        assert fc.pid is None
        return str(err.value)

    return asyncio.run(go())


@pytest.mark.parametrize("body, why", [
    ("exit 3", "its socket closed"),   # dies before its hello
    ("exec sleep 30", "no hello"),     # lives on, silent
])
def test_a_factory_without_a_hello_is_refused_with_the_reason_and_ended(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, body: str, why: str) -> None:
    fds_before = set(os.listdir("/proc/self/fd"))
    message = _start(monkeypatch, _fake_interpreter(tmp_path, body))
    assert message.startswith("the process factory did not start: ") and why in message, message
    pid = int((tmp_path / "pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert set(os.listdir("/proc/self/fd")) <= fds_before


def test_a_factory_that_cannot_be_restarted_leaves_spawns_the_direct_way(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A real factory is killed; every restart then fails (three in a row): the client is
    ``broken`` with the reason, says so in the footprint, and ``procs.spawn`` still starts
    children, directly."""
    from oarbank_agent import factory, procs

    async def go() -> None:
        fc = factory_client.FactoryClient(confine=False, backend=platform.current())
        await fc.start()
        factory.install(fc)
        try:
            first = fc.pid
            assert first is not None and fc.broken is None
            monkeypatch.setattr(sys, "executable", _fake_interpreter(tmp_path, "exit 3"))
            os.kill(first, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while fc.broken is None:
                assert time.monotonic() < deadline, "the client never gave up on its factory"
                await asyncio.sleep(0.05)
            assert "could not be restarted" in fc.broken and "started directly" in fc.broken
            assert fc.footprint()["note"] == fc.broken and fc.pid is None
            out = tmp_path / "out"
            with open(out, "wb") as f:
                proc = await procs.spawn(["/bin/sh", "-c", "echo $$"], env={}, cwd=tmp_path,
                                         stdout=f, stderr=f)
            assert not isinstance(proc, factory_client.FactoryProcess)  # started directly
            assert await proc.wait() == 0 and int(out.read_text()) == proc.pid
        finally:
            factory.install(None)
            await fc.close()

    asyncio.run(go())
