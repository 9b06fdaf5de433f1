"""Containment on Linux: every attempt, op and service daemon group in a cgroup of its own (v2).

Why: a process group is only a convention. A runner's child that calls ``setsid()`` or
``setpgid()`` leaves it and would outlive the attempt. A cgroup is not left that way (moving
needs write access to another cgroup's ``cgroup.procs``), and ``cgroup.kill`` ends every member
and descendant at once. So when the agent can use cgroup v2 each group it starts (``procs.spawn``)
gets one, and ending the group (``LinuxGroup.end``) ends the cgroup too: SIGTERM to every
member, the same grace as before, then ``cgroup.kill`` (or, on kernels before 5.14: freeze,
SIGKILL every member, thaw), then the empty cgroup is removed.

Modes (``oarbank-agent run --containment``):

- ``auto`` (default): ``cgroup`` when usable here, else ``process-group``, with the reason
  in ``status`` (``containment``, ``containment_note``).
- ``cgroup``: refuse to start the agent when cgroups are not usable.
- ``process-group``: never use cgroups (what every platform without cgroup v2 gets).

Usable means: Linux, a cgroup2 mount, the agent's own cgroup (``/proc/self/cgroup``) found in
it, and a probe child actually moved into a new child cgroup of it (this needs root or a
delegated subtree). No controller is enabled anywhere, so the agent's own cgroup may keep its
processes (the "no internal processes" rule only binds cgroups that distribute controllers):
the agent never moves itself. If it runs as a systemd service, give it ``Delegate=yes``.

Layout: ``<agent's cgroup>/oarbank/<hash of the state dir>/g<pid>-<n>``. Children enter their
cgroup before any of their own code runs: the argv goes through ``/bin/sh -c 'echo $$ >
<cg>/cgroup.procs; exec "$@"'`` (outermost, before the sandbox launcher), so nothing can fork
out in between. The base path is saved in ``<state>/containment.json``: a restarted agent
(``recovery``) ends the cgroups its predecessor left, recorded or not (``sweep``).

The mechanism (finding the agent's cgroup, moving a child in, ending and removing a cgroup) is
``cgroups.py``; this module is the mode, one cgroup per group, the sweep (``groups.py`` uses it).

Limits: a child running as root can still write itself into another cgroup; the process-group
kill is done as well, so such a child is no worse off than without cgroups.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oarbank_agent.platform.api import CONTAINMENT_MODES as MODES
from oarbank_agent.platform.api import ContainmentUnavailable
from oarbank_agent.platform.linux import cgroups

__all__ = ["Containment", "resolve"]

log = logging.getLogger("oarbank_agent.sandbox.containment")

STATE_FILE = "containment.json"


@dataclass
class Containment:
    mode: str  # cgroup | process-group
    note: str  # why this mode (readable, shown in status)
    base: Path | None = None  # this agent's cgroup for its children (cgroup mode)
    previous: list[Path] = field(default_factory=list)  # predecessors' bases (to sweep)
    kill_file: bool = False  # cgroup.kill exists (Linux >= 5.14)
    _groups: dict[int, Path] = field(default_factory=dict)  # pgid -> its cgroup
    _seq: Any = field(default_factory=itertools.count)

    @property
    def enabled(self) -> bool:
        return self.mode == "cgroup" and self.base is not None

    def report(self) -> dict[str, Any]:
        return {"containment": self.mode, "containment_note": self.note,
                "containment_base": str(self.base) if self.enabled else None}

    # --- per group ------------------------------------------------------------------------

    def new_cgroup(self) -> Path:
        """A fresh, empty cgroup for the next child. Raises OSError."""
        assert self.base is not None
        cg = self.base / f"g{os.getpid()}-{next(self._seq)}"
        cg.mkdir()
        return cg

    def wrap(self, argv: list[str], cg: Path) -> list[str]:
        return cgroups.enter_argv(argv, cg)

    def remember(self, pgid: int, cg: Path) -> None:
        self._groups[pgid] = cg

    def cgroup_of(self, pgid: int) -> Path | None:
        return self._groups.get(pgid)

    def forget(self, pgid: int) -> None:
        self._groups.pop(pgid, None)

    # --- whole subtree --------------------------------------------------------------------

    async def sweep(self, keep: set[Path], grace_s: float) -> list[Path]:
        """End every cgroup under this agent's base and its predecessors' bases except
        ``keep`` (a restarted agent: what was left, recorded or not). Returns those ended."""
        ended = []
        for base in dict.fromkeys([*self.previous, *([self.base] if self.base else [])]):
            if not base.is_dir():
                continue
            for cg in sorted(p for p in base.iterdir() if p.is_dir()):
                if cg in keep:
                    continue
                if cgroups.populated(cg):
                    ended.append(cg)
                    log.warning("ending cgroup %s left by a previous agent", cg)
                await cgroups.end_cgroup(cg, grace_s)
            if base != self.base:
                cgroups.remove(base)
        return ended

    def close(self) -> None:
        """Agent shutdown: remove the (by now empty) base cgroup."""
        if self.base is not None:
            for cg in [p for p in self.base.iterdir() if p.is_dir()] if self.base.is_dir() else []:
                if not cgroups.populated(cg):
                    cgroups.remove(cg)
            cgroups.remove(self.base)


# --- probing ----------------------------------------------------------------------------------


def resolve(mode: str, state_dir: Path) -> Containment:
    """The containment for ``mode`` on this machine. Raises ``ContainmentUnavailable``
    (``cgroup`` asked for, not usable) or ``ValueError`` (unknown mode)."""
    if mode not in MODES:
        raise ValueError(f"unknown containment {mode!r} (one of: {', '.join(MODES)})")
    state_dir = state_dir.resolve()
    previous = _previous_bases(state_dir)
    if mode == "process-group":
        return Containment("process-group", "cgroups not used (--containment process-group)",
                           previous=previous)
    own, why = cgroups.cgroup2_dir()
    base = None
    if own is not None:
        digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
        base = own / "oarbank" / digest
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = f"cannot create a cgroup under {own}: {exc.strerror or exc}"
            base = None
    if base is not None:
        why = cgroups.probe(base) or ""
        if why:
            cgroups.remove(base)
            base = None
    if base is None:
        if mode == "cgroup":
            raise ContainmentUnavailable(f"--containment cgroup, but cgroups cannot be used "
                                         f"here: {why}")
        return Containment("process-group", f"cgroups not usable here: {why}",
                           previous=previous)
    kill_file = (base / "cgroup.kill").exists()
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps({"bases": [str(p) for p in dict.fromkeys([*previous, base])]}))
    os.replace(tmp, state_dir / STATE_FILE)
    note = (f"each attempt, op and service group in its own cgroup under {base}; ended with "
            + ("cgroup.kill" if kill_file else "freeze + SIGKILL of every member")
            + "; " + cgroups.moves_note())
    return Containment("cgroup", note, base, [p for p in previous if p != base], kill_file)


def _previous_bases(state_dir: Path) -> list[Path]:
    try:
        doc = json.loads((state_dir / STATE_FILE).read_text())
        return [Path(p) for p in doc.get("bases", []) if isinstance(p, str)]
    except (OSError, ValueError, AttributeError):
        return []
