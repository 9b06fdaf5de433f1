"""Memory and CPU limits on Linux: cgroup v2's ``memory.max`` and ``cpu.max`` in each attempt's
cgroup (``containment.py`` makes it), written before the runner enters it, so nothing of the
runner runs unlimited; ``memory.swap.max`` is set to 0 where it exists (with swap the kernel
would page the attempt out instead of holding it to its limit).

When: only where the controller can be had. A child cgroup gets ``memory.max``/``cpu.max``
only when the controller is enabled in ``cgroup.subtree_control`` of every cgroup above it up
to the agent's own; the agent enables it there at start (``setup``) and, where that cannot be
done (the controller is not offered to the agent's cgroup v2 tree, as on hybrid v1/v2 hosts,
or the agent's own cgroup holds processes that are not the agent's: run it in a cgroup of its
own; the agent and its children are moved into ``<own>/agent`` first, as systemd asks of a
delegated service, since a cgroup that gives controllers to its children holds no process),
``setup`` says why, per controller (``sandbox/resourcelimits.py`` reports it).

``oom_kills``: a ``memory.events`` file's ``oom_kill`` count (the attempt's OOM fault).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

__all__ = ["CONTROLLERS", "setup", "write", "oom_kills", "oom_kills_in"]

log = logging.getLogger("oarbank_agent.sandbox.resourcelimits")

CONTROLLERS = ("memory", "cpu")


def _offered_not_enabled(cg: Path) -> bool:
    """Some controller of ours is offered to ``cg`` and not yet given to its children."""
    try:
        offered = set((cg / "cgroup.controllers").read_text().split())
        enabled = set((cg / "cgroup.subtree_control").read_text().split())
    except OSError:
        return False
    return bool((offered - enabled) & set(CONTROLLERS))


def _enable(controller: str, chain: list[Path]) -> str | None:
    """Enable ``controller`` for the children of each cgroup of ``chain`` (top first); None if
    it is enabled all the way down, else why not."""
    for cg in chain:
        try:
            offered = (cg / "cgroup.controllers").read_text().split()
            enabled = (cg / "cgroup.subtree_control").read_text().split()
        except OSError as exc:
            return f"cannot read {cg}: {exc.strerror or exc}"
        if controller in enabled:
            continue
        if controller not in offered:
            return (f"the {controller} controller is not offered to {cg} (its "
                    f"cgroup.controllers: {' '.join(offered) or 'none'})")
        try:
            (cg / "cgroup.subtree_control").write_text(f"+{controller}")
        except OSError as exc:
            return (f"cannot enable {controller} in {cg}/cgroup.subtree_control: "
                    f"{exc.strerror or exc}")
    return None


def _ours(pid: int, me: int) -> bool:
    """``pid`` is this agent or one of its descendants (its /proc parent chain)."""
    for _ in range(64):
        if pid == me:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def _make_room(own: Path) -> str | None:
    """cgroup v2 lets a cgroup other than the root give controllers to its children only while
    no process is in it. The agent's own cgroup (under systemd: its unit's, delegated) holds
    the agent: its processes move into a leaf ``<own>/agent`` first, as systemd asks of a
    delegated service. Only the agent and what it started move; any other process there is
    not the agent's to move: None, or why the room cannot be made."""
    if not (own / "cgroup.type").exists():
        return None  # the root cgroup: exempt from the rule
    try:
        pids = [int(x) for x in (own / "cgroup.procs").read_text().split()]
    except (OSError, ValueError) as exc:
        return f"cannot read {own}/cgroup.procs: {exc}"
    if not pids:
        return None
    me = os.getpid()
    others = [p for p in pids if not _ours(p, me)]
    if others:
        return (f"the agent's cgroup {own} also holds processes that are not the agent's "
                f"({', '.join(map(str, others[:5]))}): run the agent in a cgroup of its own "
                "(systemd: its unit, with Delegate=yes)")
    leaf = own / "agent"
    try:
        leaf.mkdir(exist_ok=True)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                (leaf / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        return f"cannot move the agent into {leaf}: {exc.strerror or exc}"
    log.info("the agent moved into %s, so that its own cgroup %s may give the memory and cpu "
             "controllers to the attempts' cgroups", leaf, own)
    return None


def setup(base: Path | None, why_no_cgroups: str) -> dict[str, str]:
    """Enable what it can from the agent's own cgroup down to ``base``, where each attempt's
    cgroup is made (``<agent's cgroup>/oarbank/<hash>``: containment's layout): controller ->
    why it cannot be enforced, for each one that cannot. ``base`` None: no cgroups here, and
    why."""
    if base is None:
        return {c: f"no cgroup for each attempt here ({why_no_cgroups})" for c in CONTROLLERS}
    chain = [base.parent.parent, base.parent, base]
    room = _make_room(chain[0]) if _offered_not_enabled(chain[0]) else None
    return {c: why for c in CONTROLLERS if (why := room or _enable(c, chain)) is not None}


def write(cg: Path, files: dict[str, str]) -> None:
    """Set ``files`` in a fresh cgroup before its first process enters. Raises OSError."""
    for name, value in files.items():
        (cg / name).write_text(value)
    if "memory.max" in files and (cg / "memory.swap.max").exists():
        (cg / "memory.swap.max").write_text("0")


def oom_kills(memory_events: str) -> int:
    """The ``oom_kill`` count of a ``memory.events`` file's text (0 when absent)."""
    for line in memory_events.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def oom_kills_in(cg: Path | None) -> int:
    """The OOM killer's count in cgroup ``cg`` (read before the cgroup is removed); 0 when
    there is none."""
    if cg is None:
        return 0
    text = ""
    with contextlib.suppress(OSError):
        text = (cg / "memory.events").read_text()
    return oom_kills(text)
