"""The backend's process groups (``platform.api.Groups``/``Group``), on real processes: the
chosen backend's, and the POSIX one as macOS runs it (psutil's process table, polling, no
limits) on this machine too."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oarbank_agent import platform
from oarbank_agent.platform.api import ContainmentUnavailable, Group, Groups
from oarbank_agent.platform.posix.groups import PosixGroups

# A leader that starts a second member and ignores SIGTERM when asked to.
TREE = ("import os, signal, sys, time\n"
        "if sys.argv[1] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "if os.fork() == 0:\n"
        "    if sys.argv[1] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    time.sleep(60); os._exit(0)\n"
        "print('up', flush=True); time.sleep(60)\n")


def _backends() -> list[Groups]:
    chosen = platform.current().groups
    return [chosen] if isinstance(chosen, PosixGroups) and type(chosen) is PosixGroups else [
        chosen, PosixGroups()]


@pytest.fixture(params=_backends(), ids=lambda g: type(g).__name__)
def groups(request: pytest.FixtureRequest) -> Groups:
    return request.param  # type: ignore[no-any-return]


async def _spawn(groups: Groups, how: str) -> tuple[asyncio.subprocess.Process, Group]:
    slot = groups.prepare()
    proc = await asyncio.create_subprocess_exec(
        *slot.wrap([sys.executable, "-c", TREE, how]), stdout=subprocess.PIPE,
        **slot.popen_kwargs())
    assert proc.stdout is not None
    assert await asyncio.wait_for(proc.stdout.readline(), 30) == b"up\n"
    return proc, slot.started(proc.pid)


def test_a_group_holds_its_members_and_ends_with_them(groups: Groups) -> None:
    async def main() -> None:
        proc, group = await _spawn(groups, "polite")
        deadline = time.monotonic() + 10
        while len(group.members()) < 2:  # the leader and its child
            assert time.monotonic() < deadline, group.members()
            await asyncio.sleep(0.02)
        child = next(p for p in group.members() if p != proc.pid)
        assert group.leader == proc.pid and group.alive()
        assert group.owns(child) and not group.owns(1)
        assert group.pids(groups.snapshot()) >= {proc.pid, child}
        assert groups.resident([group])[group] > 0
        assert groups.describe(group) == {"pgid": proc.pid}
        assert groups.describe(None) == {"pgid": None}
        assert await group.end(10.0) is False  # it took the polite request
        assert group.members() == [] and not group.alive()
        await proc.wait()
        assert await group.end(1.0) is False  # gone already: safe

    asyncio.run(main())


def test_a_group_that_refuses_to_stop_is_killed_after_the_grace(groups: Groups) -> None:
    async def main() -> None:
        proc, group = await _spawn(groups, "stubborn")
        began = time.monotonic()
        assert await group.end(0.3) is True
        assert time.monotonic() - began < 10
        assert group.members() == []
        assert await proc.wait() == -signal.SIGKILL == groups.killed_returncode

    asyncio.run(main())


def test_wait_gone_returns_once_the_last_member_is_gone(groups: Groups) -> None:
    async def main() -> None:
        proc, group = await _spawn(groups, "polite")
        waiting = asyncio.create_task(group.wait_gone(poll_s=0.05))
        # The window: 0.2 s, four of its 50 ms polls: a group with live members taken for gone
        # would have ended the wait by then.
        await asyncio.sleep(0.2)
        assert not waiting.done()
        group.kill()
        await asyncio.wait_for(waiting, 10)
        await proc.wait()

    asyncio.run(main())


def test_a_record_finds_the_group_again_and_a_torn_one_is_refused(groups: Groups) -> None:
    async def main() -> None:
        proc, group = await _spawn(groups, "polite")
        again = groups.restore(group.record())
        assert again == group and hash(again) == hash(group) and again.key == group.key
        assert again.alive() and proc.pid in again.members()
        assert await again.end(10.0) is False
        assert not group.alive()
        await proc.wait()
        for torn in ({}, {"pgid": "x"}):
            with pytest.raises((KeyError, ValueError, TypeError)):
                groups.restore(torn)

    asyncio.run(main())


def test_a_record_of_another_boot_is_not_alive() -> None:
    groups = platform.current().groups
    if type(groups) is PosixGroups:
        pytest.skip("no boot id on this backend: every record is of this boot")
    ours = groups.of(os.getpgid(0)).record()  # this test's own process group: alive
    mine = groups.restore({**ours, "boot_id": _this_boot(groups)})
    assert mine.alive()
    assert not groups.restore({**ours, "boot_id": "another boot"}).alive()


def _this_boot(groups: Groups) -> str | None:
    proc_group = groups.prepare().started(os.getpid())  # a started group knows the boot
    return proc_group.record().get("boot_id")  # type: ignore[no-any-return]


def test_posix_groups_alone_offer_no_limits_and_say_so(tmp_path: Path) -> None:
    groups = PosixGroups(system="darwin")
    box = groups.resolve("auto", tmp_path)
    assert (box.mode, box.enabled) == ("process-group", False)
    assert box.note == "cgroups not usable here: cgroups do not exist on darwin"
    assert groups.resolve("process-group", tmp_path).report()["containment_base"] is None
    with pytest.raises(ContainmentUnavailable, match="cgroups do not exist on darwin"):
        groups.resolve("cgroup", tmp_path)
    with pytest.raises(ValueError, match="unknown containment 'jail'"):
        groups.resolve("jail", tmp_path)
    assert set(groups.limit_gaps(None, "why")) == {"memory", "cpu"}
    assert groups.prepare({"memory.max": "1"}).factory_kwargs() == {"join": None}
    assert groups.can_inspect is False and groups.process_status(1) is None

