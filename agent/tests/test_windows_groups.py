"""The Windows backend's process side: groups in job objects, the process table, the
sandbox's walls, the factory host.

The limit translation is pure and runs everywhere; the rest is Windows only: here under Wine
with Windows' own CPython (``nox -s windows -- -q agent/tests/test_windows_groups.py``;
harness/tests/test_wine.py runs it from the Linux suite), on real Windows in the
``windows-latest`` workflow job. Real processes started the agent's way
(``asyncio.create_subprocess_exec`` with the slot's keywords), real job objects.

What Wine cannot show, so the tests that stand in for it say where: a job's memory limit
enforced (Wine accepts it; ``limit_gaps`` reports it missing there), the CPU rate cap (Wine
refuses it: a gap there), Ctrl-Break reaching a group (only with a shared console), an
AppContainer or restricted token, psutil's handle count.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from oarbank_agent.platform.windows.limits import JobLimits, job_limits

win_only = pytest.mark.skipif(
    sys.platform != "win32",
    reason="Windows job objects: run under Wine by `nox -s windows`, or on Windows")

if sys.platform == "win32":
    from oarbank_agent.platform.windows import jobapi
    from oarbank_agent.platform.windows.factoryhost import WindowsFactoryHost
    from oarbank_agent.platform.windows.groups import KILLED_EXIT, JobGroup, WindowsGroups
    from oarbank_agent.platform.windows.limits import WINE_MEMORY_GAP
    from oarbank_agent.platform.windows.sandboxhost import ENFORCED, WindowsSandboxHost


# -- the limit translation (pure) -----------------------------------------------------------

def test_stage_limits_become_a_job_memory_limit_and_a_cpu_rate() -> None:
    assert job_limits({}, 8) == JobLimits(0, 0)
    assert job_limits({"memory.max": str(2**30), "cpu.max": "200000 100000"}, 8) == JobLimits(
        2**30, 2500)  # two cores of eight: a quarter of the machine
    assert job_limits({"cpu.max": "1000 100000"}, 64).cpu_rate == 2  # rounded up, never 0
    assert job_limits({"cpu.max": "900000 100000"}, 4).cpu_rate == 10000  # at most all of it


@pytest.mark.parametrize(("files", "message"), [
    ({"memory.max": "lots"}, "memory.max 'lots' is not a whole number"),
    ({"memory.max": "0"}, "must be positive"),
    ({"cpu.max": "max 100000"}, "cpu.max 'max' is not a whole number"),
    ({"cpu.max": "100000"}, "want 'quota period'"),
    ({"pids.max": "10"}, "'pids.max' has no job object equivalent"),
])
def test_unreadable_limits_are_named(files: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        job_limits(files, 4)


# -- groups in job objects --------------------------------------------------------------------

# The leader's first line asks whether it is already in a job, then starts a grandchild.
LEADER = r"""
import ctypes, subprocess, sys, time
k32 = ctypes.WinDLL("kernel32")
inside = ctypes.c_int()
k32.IsProcessInJob(ctypes.c_void_p(-1), None, ctypes.byref(inside))
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(bool(inside.value), g.pid, flush=True)
time.sleep(120)
"""
IN_JOB = LEADER.split("g = ")[0] + "print(bool(inside.value), flush=True)\n"


async def _start(groups: WindowsGroups, code: str, *args: str,
                 limits: dict[str, str] | None = None) -> tuple[asyncio.subprocess.Process,
                                                                 JobGroup]:
    slot = groups.prepare(limits)
    try:
        proc = await asyncio.create_subprocess_exec(
            *slot.wrap([sys.executable, "-c", code, *args]), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, **slot.popen_kwargs())
    except BaseException:
        slot.abandon()
        raise
    group = slot.started(proc.pid)
    assert isinstance(group, JobGroup)
    return proc, group


def _alive(pid: int) -> bool:
    from oarbank_agent.platform.windows import proctable

    return proctable.is_running(pid, None)


@win_only
def test_a_leader_is_in_its_job_from_its_first_line_and_its_children_with_it() -> None:
    async def main() -> None:
        groups = WindowsGroups()
        proc, group = await _start(groups, LEADER)
        try:
            assert proc.stdout is not None
            inside, grandchild = (await proc.stdout.readline()).split()
            assert inside == b"True"  # started suspended, placed, then resumed
            assert sorted(group.members()) == sorted([proc.pid, int(grandchild)])
            assert group.owns(int(grandchild)) and not group.owns(os.getpid())
            assert groups.of(proc.pid) is group
            assert groups.describe(group) == {"job": group.name, "leader": proc.pid}
            assert groups.resident([group])[group] > 0
            assert b"time.sleep" in (groups.cmdline(proc.pid) or b"")
            group.kill()
            assert await proc.wait() == groups.killed_returncode == KILLED_EXIT
            await asyncio.wait_for(group.wait_gone(), 10)
            assert not _alive(int(grandchild)) and not group.alive()
        finally:
            groups.containment.close()
    asyncio.run(main())


@win_only
def test_wait_gone_returns_when_the_last_process_of_the_job_exits() -> None:
    """The leader exits at once, its grandchild later: gone only after both (the port's
    message, or the count looked at every poll_s). The grandchild leaves the leader's stdout
    alone: asyncio's wait would wait for that pipe to close too."""
    code = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(3)'], stdout=subprocess.DEVNULL)")

    async def main() -> None:
        groups = WindowsGroups()
        proc, group = await _start(groups, code)
        try:
            assert await proc.wait() == 0
            assert group.alive()  # the grandchild is still in it
            await asyncio.wait_for(group.wait_gone(poll_s=30), 20)  # not by polling
            assert group.members() == []
        finally:
            groups.containment.close()
    asyncio.run(main())


@win_only
def test_end_stops_the_group_and_kills_what_refuses() -> None:
    """Ctrl-Break reaches a group only through a shared console (the test's python.exe may
    have none under Wine), so whether ``end`` had to kill is not asserted for the plain
    sleeper; the one ignoring Ctrl-Break must be killed."""
    stubborn = ("import signal, time; signal.signal(signal.SIGBREAK, signal.SIG_IGN); "
                "print('x', flush=True); time.sleep(120)")

    async def main() -> None:
        groups = WindowsGroups()
        try:
            proc, group = await _start(groups, stubborn)
            assert proc.stdout is not None
            await proc.stdout.readline()
            assert await group.end(0.5) is True
            assert not group.alive() and group.job is not None and group.job.handle is None
            await proc.wait()
            assert await group.end(0.5) is False  # already gone: safe
            assert groups.ending(True, 0.5) == "Ctrl-Break, then TerminateJobObject after 0.5s"
        finally:
            groups.containment.close()
    asyncio.run(main())


@win_only
def test_a_record_finds_the_named_job_again_and_a_torn_one_is_refused() -> None:
    async def main() -> None:
        groups = WindowsGroups()
        proc, group = await _start(groups, LEADER)
        try:
            assert proc.stdout is not None
            _inside, grandchild = (await proc.stdout.readline()).split()
            rec = group.record()
            assert rec["job"].startswith("Local\\oarbank-") and rec["leader"] == proc.pid
            again = groups.restore(rec)  # another handle to the same job, by its name
            assert isinstance(again, JobGroup) and again == group
            assert sorted(again.members()) == sorted([proc.pid, int(grandchild)])
            groups.adopt(again)
            assert await groups.sweep([again], 1.0) == []
            for torn, error in (({}, KeyError), ({"leader": "x", "job": None}, ValueError),
                                ({"leader": 5, "job": "Global\\theirs"}, ValueError),
                                ({"leader": 5, "job": None, "started_ms": "soon"}, TypeError)):
                with pytest.raises(error):
                    groups.restore(torn)
            group.kill()
            await proc.wait()
            await asyncio.wait_for(again.wait_gone(), 10)
            again.release()
            group.release()  # our last handle
            # Whether the name still opens depends on who holds the job's ended processes
            # (here asyncio holds the leader's handle): either way nothing of it is alive.
            gone = groups.restore(rec)
            assert isinstance(gone, JobGroup) and not gone.alive() and gone.members() == []
            if gone.job is not None:
                gone.release()
        finally:
            groups.containment.close()
    asyncio.run(main())


@win_only
def test_limits_are_set_where_enforced_and_the_gaps_named() -> None:
    """Windows enforces both (``{}``); Wine accepts a memory limit without enforcing it and
    refuses the CPU rate cap: both gaps, named. A job with a memory limit still starts."""
    groups = WindowsGroups()
    gaps = groups.limit_gaps(None, "")
    if jobapi.is_wine():
        assert gaps["memory"] == WINE_MEMORY_GAP
        assert "CPU rate control" in gaps["cpu"]
    else:
        assert gaps == {}

    async def main() -> None:
        allowed = {"memory.max": str(2**30)} if "cpu" in gaps else {
            "memory.max": str(2**30), "cpu.max": "50000 100000"}
        proc, group = await _start(groups, IN_JOB, limits=allowed)
        try:
            assert proc.stdout is not None
            assert (await proc.stdout.readline()).strip() == b"True"
            assert await proc.wait() == 0
            assert group.oom_kills() == 0
        finally:
            groups.containment.close()
    asyncio.run(main())


@win_only
def test_containment_is_a_job_object_whatever_is_asked_but_cgroup() -> None:
    from oarbank_agent.platform.api import ContainmentUnavailable

    groups = WindowsGroups()
    for mode in ("auto", "process-group"):
        rep = groups.resolve(mode, Path("."))
        assert rep.mode == "job-object" and rep.enabled and "kill-on-close" in rep.note
        assert rep.report()["containment"] == "job-object"
    with pytest.raises(ContainmentUnavailable, match="do not exist on Windows"):
        groups.resolve("cgroup", Path("."))
    with pytest.raises(ValueError, match="unknown containment"):
        groups.resolve("jail", Path("."))


# -- the sandbox's walls, the factory host ----------------------------------------------------

@win_only
def test_the_sandbox_names_each_wall_and_what_job_objects_enforce() -> None:
    host = WindowsSandboxHost()
    walls = host.walls()
    assert walls["job_ui_limits"] == ENFORCED and walls["job_process_limit"] == ENFORCED
    if jobapi.is_wine():
        assert walls["windows_appcontainer"] == "not available under Wine"
    reason = host.unavailable_reason()
    assert reason is not None  # no launcher confines a child here: required refuses
    assert "windows_appcontainer (" in reason and "windows_restricted_token (" in reason
    assert "job objects enforce: job_ui_limits, job_process_limit" in reason
    assert not host.set_undumpable() and not host.undumpable()


@win_only
def test_the_factory_host_has_no_factory_and_watches_a_process() -> None:
    host = WindowsFactoryHost()
    with pytest.raises(OSError, match="no process factory"):
        host.client(confine=False, backend=None)
    assert host.footprint(os.getpid())["rss_bytes"] > 0
    assert host.footprint(4_000_000) == {}

    async def main() -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(0.5)", stdin=asyncio.subprocess.DEVNULL)
        await asyncio.wait_for(host.until_gone(proc.pid), 20)
        assert await proc.wait() == 0
        await host.until_gone(4_000_000)  # no such process: at once
    asyncio.run(main())


# An agent's part only: groups made the agent's way, then it is killed (no cleanup runs).
AGENT = r"""
import asyncio, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from test_windows_groups import LEADER, _start
from oarbank_agent.platform.windows.groups import WindowsGroups

async def main():
    groups = WindowsGroups()
    groups.install(groups.resolve("auto", Path(".")))  # nested in the agent's own job
    proc, group = await _start(groups, LEADER)
    print(proc.pid, (await proc.stdout.readline()).split()[1].decode(), flush=True)
    await asyncio.sleep(120)
asyncio.run(main())
"""


@win_only
def test_a_killed_agent_leaves_none_of_its_groups_running() -> None:
    import subprocess

    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(Path(__file__).parent)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert agent.stdout is not None
    try:
        leader, grandchild = (int(p) for p in agent.stdout.readline().split())
        assert _alive(leader) and _alive(grandchild)
        agent.kill()  # TerminateProcess: the kernel closes its handles, the job's last one
        agent.wait(timeout=10)
        host = WindowsFactoryHost()

        async def gone() -> None:
            await asyncio.wait_for(host.until_gone(leader), 10)
            await asyncio.wait_for(host.until_gone(grandchild), 10)
        asyncio.run(gone())
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.stdout.close()


@win_only
def test_a_plain_sleeper_ends_at_ctrl_break_where_it_shares_the_console() -> None:
    """Whether Ctrl-Break reached it depends on a console shared with this process; what
    must hold either way: ``end`` leaves nothing, killing only after the grace."""
    async def main() -> None:
        groups = WindowsGroups()
        try:
            proc, group = await _start(groups, LEADER)
            assert proc.stdout is not None
            await proc.stdout.readline()
            killed = await group.end(3.0)
            print("ctrl-break", "refused or unheard: killed" if killed else "ended it")
            assert not group.alive()
            rc = await proc.wait()
            assert (rc == KILLED_EXIT) if killed else rc != 0
        finally:
            groups.containment.close()
    asyncio.run(main())


@win_only
def test_sandbox_required_refuses_and_auto_names_the_missing_walls(monkeypatch) -> None:
    """The agent's own policy over the Windows host (only the backend's sandbox part is put
    in place: the whole backend is not assembled yet)."""
    from types import SimpleNamespace

    from oarbank_agent import platform
    from oarbank_agent.sandbox import policy

    monkeypatch.setattr(platform, "_backend", SimpleNamespace(sandbox=WindowsSandboxHost()))
    with pytest.raises(policy.SandboxUnavailable, match="windows_appcontainer"):
        policy.resolve("required", {})
    auto = policy.resolve("auto", {})
    assert not auto.enforce
    note = auto.report()["note"]
    assert "windows_appcontainer (" in note and "job objects enforce:" in note, note


# An agent killed in the window between starting a leader (suspended) and placing it.
UNPLACED = r"""
import asyncio, sys
from pathlib import Path
from oarbank_agent.platform.windows.groups import WindowsGroups

async def main():
    groups = WindowsGroups()
    containment = groups.resolve("auto", Path("."))
    groups.install(containment)  # the agent enters a kill-on-close job of its own
    print(containment.note, flush=True)
    slot = groups.prepare()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(120)", **slot.popen_kwargs())
    print(proc.pid, flush=True)  # never placed: slot.started is not called
    await asyncio.sleep(120)
asyncio.run(main())
"""


@win_only
def test_an_agent_killed_before_placing_a_leader_leaves_it_not_running() -> None:
    import subprocess

    agent = subprocess.Popen([sys.executable, "-c", UNPLACED], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE)
    assert agent.stdout is not None
    try:
        note = agent.stdout.readline().decode()
        assert "the agent in a kill-on-close job of its own" in note, note
        leader = int(agent.stdout.readline())
        assert _alive(leader)  # suspended, in the agent's job only
        agent.kill()
        agent.wait(timeout=10)
        asyncio.run(asyncio.wait_for(WindowsFactoryHost().until_gone(leader), 10))
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.stdout.close()
