"""procs.retire_group: how every op, runner and service group is finished, also when the
agent's shutdown cancels it in the middle of the grace period.

CI once found a ``procs/<pgid>.json`` left after a clean stop: a cancel that landed while a
group was being ended skipped the record's removal. Real process groups here, started with
``procs.spawn`` and recorded in a real registry.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from oarbank_agent import procs

# Survives SIGTERM (it says "term" and runs on), so only a SIGKILL ends it before the grace
# period is over.
STUBBORN = ("import signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: print('term', flush=True))\n"
            "print('up', flush=True)\n"
            "while True: time.sleep(60)\n")


async def _start(registry: procs.ProcessRegistry, tmp_path: Path) -> procs.ChildProcess:
    out = open(tmp_path / "out", "wb")  # noqa: SIM115 - the child holds its own copy
    try:
        proc = await procs.spawn([sys.executable, "-c", STUBBORN], env={}, cwd=tmp_path,
                                 stdout=out, stderr=subprocess.DEVNULL, registry=registry,
                                 kind="op", label="stubborn")
    finally:
        out.close()
    deadline = time.monotonic() + 30
    while (tmp_path / "out").read_bytes() != b"up\n":  # its SIGTERM handler is in place
        assert time.monotonic() < deadline, "the child never started"
        await asyncio.sleep(0.02)
    return proc


def test_a_cancel_in_the_grace_period_kills_the_group_and_clears_its_record(
        tmp_path: Path) -> None:
    async def main() -> tuple[bool, float]:
        registry = procs.ProcessRegistry(tmp_path / "state")
        proc = await _start(registry, tmp_path)
        assert [r.group.leader for r in registry.records()] == [proc.pid]
        task = asyncio.create_task(procs.retire_group(registry, procs.group_of(proc), 30.0))
        deadline = time.monotonic() + 30
        while (tmp_path / "out").read_bytes() != b"up\nterm\n":  # SIGTERM came, survived
            assert time.monotonic() < deadline, "no SIGTERM reached the child"
            await asyncio.sleep(0.02)
        assert not task.done()  # well inside the 30 s grace
        began = time.monotonic()
        task.cancel()
        cancelled = False
        try:
            await task
        except asyncio.CancelledError:
            cancelled = True
        await proc.wait()
        return cancelled, time.monotonic() - began

    cancelled, took = asyncio.run(main())
    assert cancelled, "the cancel must reach the caller"
    assert took < 10, f"the group should be SIGKILLed at once, took {took:.1f}s"
    assert list((tmp_path / "state" / "procs").glob("*.json")) == []


def test_an_uncancelled_retire_escalates_and_clears_its_record(tmp_path: Path) -> None:
    async def main() -> tuple[int, bool, list[int]]:
        registry = procs.ProcessRegistry(tmp_path / "state")
        proc = await _start(registry, tmp_path)
        group = procs.group_of(proc)
        killed = await procs.retire_group(registry, group, 0.3)
        left = group.members()
        await proc.wait()
        return proc.pid, killed, left

    _pgid, killed, left = asyncio.run(main())
    assert killed, "a group that ignores SIGTERM is SIGKILLed after the grace period"
    assert left == []
    assert list((tmp_path / "state" / "procs").glob("*.json")) == []
