"""The escape check: every few seconds, each process of a sandboxed group is still confined.

Every runner, op and service group the agent started (``procs.ProcessRegistry``: its
``Group``, with every process the backend can follow into it) is sandboxed from its first
instruction: the launcher confines itself before exec and every descendant inherits the filter
and no_new_privs. A member of such a group whose kernel status (``Groups.process_status``) does
not say ``Seccomp: 2`` and ``NoNewPrivs: 1`` got there some other way (moved into the group
from outside, or a bug in the launcher path): it is not ours to trust. It is killed, the whole
group with it (its sandbox is no longer one), and the attempt or service fails with reason
``sandbox_escape`` (``take(group)`` hands the reason to whoever ends it:
``runner.run_attempt``, ``ReadyWatch.until_failed``).

The one member allowed to be unconfined is the group's leader during its launcher's own set-up
(``SETUP_GRACE_S`` after the spawn, and only while its command line is still the launcher's
or the entry shell in front of it, or the process factory's: a child it forked shows the
factory's command line until it has confined itself, ``factory/child.py``).

Confinement only goes one way (nothing undoes a filter or no_new_privs), so the verdict
"unconfined" rests on a status read made after the command line was read: a leader read
unconfined in its set-up, which confines itself and execs its child before its command line
is read, is read again, not killed for the stale status (seen under load, 60 runners at once).

Only when the sandbox enforces (``sandboxing.current().enforce``) and the backend can read a
process's confinement (``Groups.can_inspect``): unconfined by policy is not an escape.
"""

from __future__ import annotations

import asyncio
import logging
import time

from oarbank_agent import platform, procs
from oarbank_agent.platform.api import Group
from oarbank_agent.sandbox import policy as sandboxing

__all__ = ["INTERVAL_S", "check_once", "start", "take"]

log = logging.getLogger("oarbank_agent.sandbox")

INTERVAL_S = 3.0
SETUP_GRACE_S = 15.0
_LAUNCHER_MARK = b"oarbank_sdk.sandbox.launch"
_FACTORY_MARK = b"oarbank_agent.platform.linux.factory\0"  # in the factory's argv (``-m``)

_escapes: dict[str, str] = {}  # group key -> the failure reason, until taken


def take(group: Group | None) -> str | None:
    """The ``sandbox_escape`` reason of ``group`` if the check ended it (once)."""
    return None if group is None else _escapes.pop(group.key, None)


def _in_setup(pid: int, rec: procs.GroupRecord) -> bool:
    if pid != rec.group.leader or time.time() - rec.started > SETUP_GRACE_S:
        return False
    cmdline = platform.current().groups.cmdline(pid) or b""
    return _LAUNCHER_MARK in cmdline or _FACTORY_MARK in cmdline


def _no_escape(st: dict[str, str] | None) -> bool:
    """Gone, a zombie, or confined (Seccomp 2 and NoNewPrivs 1)."""
    return (st is None or st.get("State", "").startswith("Z")
            or (st.get("Seccomp") == "2" and st.get("NoNewPrivs") == "1"))


def check_once(registry: procs.ProcessRegistry) -> list[str]:
    """Look at every recorded group once; end those with an unconfined member. Returns the
    reasons of the groups it ended."""
    if not sandboxing.current().enforce:
        return []
    ended = []
    # One read of the process table for every group: reading it per group cost the agent's
    # loop ~0.3 s a check with 32 attempts on a busy machine (the bench's connect profile).
    groups = platform.current().groups
    table = groups.snapshot()
    for rec in registry.records():
        for pid in sorted(rec.group.pids(table)):
            if _no_escape(groups.process_status(pid)) or _in_setup(pid, rec):
                continue
            st = groups.process_status(pid)  # read after its command line: see the docstring
            if _no_escape(st):
                continue
            assert st is not None
            reason = (f"{sandboxing.SANDBOX_ESCAPE}: pid {pid} ({st.get('Name', '?')}) in "
                      f"{rec.kind} group {rec.group} ({rec.label}) is not confined "
                      f"(Seccomp {st.get('Seccomp', '?')}, NoNewPrivs {st.get('NoNewPrivs', '?')})")
            log.error("%s: killed with its group", reason)
            _escapes.setdefault(rec.group.key, reason)
            rec.group.kill(also=pid)
            ended.append(reason)
            break
    return ended


async def _loop(registry: procs.ProcessRegistry, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            check_once(registry)
        except Exception:  # never let the check die quietly: say so, keep checking
            log.exception("sandbox escape check failed")


def start(registry: procs.ProcessRegistry, interval_s: float = INTERVAL_S
          ) -> asyncio.Task[None] | None:
    """The check task, or None when the sandbox does not enforce (nothing to check)."""
    if not sandboxing.current().enforce or not platform.current().groups.can_inspect:
        return None
    return asyncio.create_task(_loop(registry, interval_s), name="sandbox escape check")
