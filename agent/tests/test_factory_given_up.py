"""A spawn given up (its task cancelled: an agent's stop, a service's stop) once the factory
was asked leaves no child behind: the child is ended as soon as its pid is known, whether that
was before the cancel or after it. Before, the client forgot the spawn and its child ran on,
known to nobody (with process groups only, nothing at the agent's stop could find it).

Real factory, real children. A child is held before its start by its own first step: it writes
its pid into its group's ``join`` file, here a FIFO nobody reads yet (the directory is no
cgroup, so the factory forks the old way and the child opens the file itself). The second
test stops the factory (SIGSTOP) to give up a spawn it has been asked for but has not forked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest

from oarbank_agent import platform
from oarbank_agent.platform.linux.factory import client as factory_client


async def _spawn(fc: factory_client.FactoryClient, argv: list[str],
                 join: str | None = None) -> factory_client.FactoryProcess:
    return await fc.spawn(argv, env={}, cwd="/", fds=[], join=join, kind="service", label="t")


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []


async def _until_no_children(fc: factory_client.FactoryClient, within_s: float) -> list[str]:
    """The factory's live children after waiting up to ``within_s`` for there to be none."""
    pid = fc.pid
    assert pid is not None
    deadline = time.monotonic() + within_s
    while True:
        left = [c for c in _children(pid) if c.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            return [" ".join(c.cmdline()) or str(c.pid) for c in left]
        await asyncio.sleep(0.05)


async def _until_asked(fc: factory_client.FactoryClient) -> None:
    """Until a spawn's request has gone to the factory. (The client's own state: a spawn is
    pending from just before its send, and a request that fits the socket goes at once,
    without a yield: so once another task sees it pending, the spawn awaits the answer.)"""
    deadline = time.monotonic() + 10
    while not fc._pending:
        assert time.monotonic() < deadline, "the spawn never sent its request"
        await asyncio.sleep(0.01)


async def _until_sending(fc: factory_client.FactoryClient) -> None:
    """Until a request too big for the socket has its first part sent and waits on its
    tail: the client's send lock is held from the first send to the tail's end, and its
    first yield is on the tail."""
    deadline = time.monotonic() + 10
    while not fc._send_lock.locked():
        assert time.monotonic() < deadline, "the spawn never began its send"
        await asyncio.sleep(0.01)


def _held_group(tmp_path: Path, name: str) -> Path:
    fifo = tmp_path / name / "cgroup.procs"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    return fifo


@contextlib.asynccontextmanager
async def _factory(fifos: tuple[Path, ...] = ()) -> AsyncIterator[tuple[
        factory_client.FactoryClient, int]]:
    """A started factory and its pid; at the end every held child is let go, then it ends."""
    fc = factory_client.FactoryClient(confine=False, backend=platform.current())
    await fc.start()
    assert fc.pid is not None
    try:
        yield fc, fc.pid
    finally:
        await _close(fc, list(fifos))


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    """The factory stopped (SIGSTOP): what is sent to it waits in its socket, unread."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def _close(fc: factory_client.FactoryClient, fifos: list[Path]) -> None:
    """Let every held child go and end what a failed test left, then the factory. (A child
    still blocked in its open of the FIFO is killed there just the same.)"""
    readers = [os.open(f, os.O_RDONLY | os.O_NONBLOCK) for f in fifos]
    if fc.pid is not None:
        for c in _children(fc.pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                c.kill()
    for r in readers:
        os.close(r)
    await fc.close()


def test_a_spawn_given_up_after_the_fork_ends_its_child(tmp_path: Path) -> None:
    fifo = _held_group(tmp_path, "held")

    async def go() -> None:
        async with _factory((fifo,)) as (fc, factory_pid):
            held = asyncio.create_task(_spawn(fc, ["/bin/sleep", "300"], str(fifo)))
            deadline = time.monotonic() + 20
            while not _children(factory_pid) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert _children(factory_pid), "the factory never forked the child"
            held.cancel()
            with pytest.raises(asyncio.CancelledError):
                await held
            assert await _until_no_children(fc, 10) == []
            # The factory goes on: the next spawn is answered.
            proc = await asyncio.wait_for(_spawn(fc, ["/bin/sh", "-c", "exit 4"]), 20)
            assert await asyncio.wait_for(proc.wait(), 20) == 4
            assert fc.footprint()["children"] == 0

    asyncio.run(go())


def test_a_spawn_given_up_before_the_fork_ends_its_child_when_it_is_forked() -> None:
    marker = f"given-up-{os.getpid()}-{time.monotonic_ns()}"

    async def go() -> None:
        async with _factory() as (fc, factory_pid):
            with _stopped(factory_pid):
                given_up = asyncio.create_task(
                    _spawn(fc, ["/bin/sh", "-c", f"sleep 300; : {marker}"]))
                await _until_asked(fc)
                assert not given_up.done() and not _children(factory_pid)
                given_up.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await given_up
            # The factory reads the request now, and forks.
            proc = await asyncio.wait_for(_spawn(fc, ["/bin/sh", "-c", "exit 6"]), 20)
            assert await asyncio.wait_for(proc.wait(), 20) == 6
            assert await _until_no_children(fc, 10) == []
            assert not [p.pid for p in psutil.process_iter(["cmdline"])
                        if marker in " ".join(p.info["cmdline"] or ())]

    asyncio.run(go())


def test_a_spawn_given_up_mid_message_still_sends_all_of_it() -> None:
    """A request bigger than the socket's buffer, given up while its tail waits for the
    (stopped) factory to read: the tail still goes, so the factory reads the next request
    whole. Before, the cut message ran into the next one and the factory's next read hung."""

    async def go() -> None:
        async with _factory() as (fc, factory_pid):
            with _stopped(factory_pid):
                # ~1 MiB of environment (each value under the kernel's 128 KiB a string),
                # past the socket's buffer: the send waits on its tail.
                big = {f"PAD{i}": "x" * 100_000 for i in range(10)}
                given_up = asyncio.create_task(fc.spawn(
                    ["/bin/sh", "-c", "sleep 300"], env=big, cwd="/", fds=[], join=None,
                    kind="service", label="t"))
                await _until_sending(fc)
                assert not given_up.done()
                given_up.cancel()
                for _ in range(3):
                    await asyncio.sleep(0)  # the cancel reaches the task, which sends on
                assert not given_up.done(), "the cancel cut the request short"
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(given_up, 20)
            proc = await asyncio.wait_for(_spawn(fc, ["/bin/sh", "-c", "exit 3"]), 20)
            assert await asyncio.wait_for(proc.wait(), 20) == 3
            assert (fc.restarts, fc.pid) == (0, factory_pid)
            assert await _until_no_children(fc, 10) == []

    asyncio.run(go())
