"""The factory forks the next child while one is still starting, and still says each child's
start before its exit (the agent knows a pid only from ``started``).

Real factory, real children. A child is held before its start by its own first step: it writes
its pid into its group's ``join`` file, here a FIFO nobody reads yet (the directory is no
cgroup, so the factory forks the old way and the child opens the file itself)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import psutil

from oarbank_agent import platform
from oarbank_agent.platform.linux.factory import client as factory_client


async def _spawn(fc: factory_client.FactoryClient, argv: list[str],
                 join: str | None = None) -> factory_client.FactoryProcess:
    return await fc.spawn(argv, env={}, cwd="/", fds=[], join=join, kind="op", label="t")


def test_a_child_held_before_its_start_does_not_hold_the_next_spawn(tmp_path: Path) -> None:
    fifo = tmp_path / "group" / "cgroup.procs"
    fifo.parent.mkdir()
    os.mkfifo(fifo)

    async def go() -> None:
        fc = factory_client.FactoryClient(confine=False, backend=platform.current())
        await fc.start()
        reader = -1
        try:
            held = asyncio.create_task(_spawn(fc, ["/bin/sh", "-c", "exit 5"], str(fifo)))
            # The factory has forked it: the child is held in its open of the FIFO.
            assert fc.pid is not None
            deadline = time.monotonic() + 20
            while not psutil.Process(fc.pid).children():
                assert time.monotonic() < deadline, "the factory never forked the held child"
                await asyncio.sleep(0.02)
            assert not held.done()
            # Before: the factory read each child's start before the next request, and this
            # one waited on the held child for good.
            other = await asyncio.wait_for(_spawn(fc, ["/bin/sh", "-c", "exit 7"]), 20)
            assert await asyncio.wait_for(other.wait(), 20) == 7
            assert not held.done(), "the held child was said started before its start"
            reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            proc = await asyncio.wait_for(held, 20)
            assert await asyncio.wait_for(proc.wait(), 20) == 5
            assert os.read(reader, 64).decode().strip() == str(proc.pid)
        finally:
            if reader < 0:  # a failure above: the held child is let go, not left behind
                reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
                await asyncio.wait({held}, timeout=10)  # its start, once past the FIFO
            os.close(reader)
            await fc.close()

    asyncio.run(go())


def test_many_children_at_once_each_get_their_start_and_their_own_exit(tmp_path: Path) -> None:
    """Children that end as soon as they start, many at a time, and commands that cannot run
    among them: each spawn answers its own pid and exit code (a child reaped before its start
    was read is said started first, then ended), or the error a direct start raises; nothing
    is left running and no descriptor is kept."""
    fds_before = set(os.listdir("/proc/self/fd"))

    async def go() -> None:
        fc = factory_client.FactoryClient(confine=False, backend=platform.current())
        await fc.start()
        try:
            async def one(i: int) -> tuple[int, int | str]:
                if i % 10 == 9:
                    try:
                        await _spawn(fc, [str(tmp_path / "no-such-command")])
                    except OSError as exc:
                        return i, f"errno {exc.errno}"
                    return i, "ran"
                proc = await _spawn(fc, ["/bin/sh", "-c", f"exit {i % 7}"])
                return i, await asyncio.wait_for(proc.wait(), 60)

            got = dict(await asyncio.gather(*(one(i) for i in range(120))))
            want = {i: (f"errno {2}" if i % 10 == 9 else i % 7) for i in range(120)}
            assert got == want
            assert fc.footprint()["children"] == 0
            factory_pid = fc.pid
            assert factory_pid is not None
            assert not Path(f"/proc/{factory_pid}/task/{factory_pid}/children").read_text().split()
        finally:
            await fc.close()

    asyncio.run(go())
    assert set(os.listdir("/proc/self/fd")) <= fds_before
