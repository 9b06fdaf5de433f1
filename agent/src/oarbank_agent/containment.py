"""Containment: every attempt, op and service daemon group in a cgroup of its own (Linux, v2).

Why: a process group is only a convention. A runner's child that calls ``setsid()`` or
``setpgid()`` leaves it and would outlive the attempt. A cgroup is not left that way (moving
needs write access to another cgroup's ``cgroup.procs``), and ``cgroup.kill`` ends every member
and descendant at once. So when the agent can use cgroup v2 each group it starts (``procs.spawn``)
gets one, and ending the group (``procs.end_group``) ends the cgroup too: SIGTERM to every
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

Limits: a child running as root can still write itself into another cgroup; the process-group
kill is done as well, so such a child is no worse off than without cgroups.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MODES", "Containment", "ContainmentUnavailable", "resolve", "install", "current",
           "populated", "end_cgroup", "cgroup2_dir"]

log = logging.getLogger("oarbank_agent.containment")

MODES = ("auto", "cgroup", "process-group")
STATE_FILE = "containment.json"
# The child moves itself, then becomes argv. `unset PWD`: the shell exports PWD on its own, and
# a child's environment is exactly the contract's (nothing the wrapper adds survives the exec).
ENTER = 'echo $$ > "$0" || exit 125; unset PWD; exec "$@"'


class ContainmentUnavailable(Exception):
    """``--containment cgroup`` where cgroups cannot be used."""


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
        return ["/bin/sh", "-c", ENTER, str(cg / "cgroup.procs"), *argv]

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
                if populated(cg):
                    ended.append(cg)
                    log.warning("ending cgroup %s left by a previous agent", cg)
                await end_cgroup(cg, grace_s)
            if base != self.base:
                _rmdir(base)
        return ended

    def close(self) -> None:
        """Agent shutdown: remove the (by now empty) base cgroup."""
        if self.base is not None:
            for cg in [p for p in self.base.iterdir() if p.is_dir()] if self.base.is_dir() else []:
                if not populated(cg):
                    _rmdir(cg)
            _rmdir(self.base)


# --- probing ----------------------------------------------------------------------------------


def cgroup2_dir() -> tuple[Path | None, str]:
    """The agent's own cgroup v2 directory, or None and why not."""
    if not sys.platform.startswith("linux"):
        return None, f"cgroups do not exist on {sys.platform}"
    mount = root = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                pre, _, post = line.partition(" - ")
                if post.split(" ", 1)[0] == "cgroup2":
                    parts = pre.split()
                    root, mount = parts[3], parts[4]
                    break
    except OSError as exc:
        return None, f"cannot read /proc/self/mountinfo: {exc}"
    if mount is None or root is None:
        return None, "no cgroup v2 file system is mounted"
    own = None
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    own = line[3:].strip()
    except OSError as exc:
        return None, f"cannot read /proc/self/cgroup: {exc}"
    if own is None:
        return None, "this process has no cgroup v2 membership"
    if root != "/" and not (own == root or own.startswith(root.rstrip("/") + "/")):
        return None, f"the agent's cgroup {own} is outside the cgroup2 mount's root {root}"
    rel = own[len(root):] if root != "/" else own
    path = Path(mount) / rel.lstrip("/")
    if not (path / "cgroup.procs").exists():
        return None, f"the agent's cgroup {path} is not visible"
    return path, ""


def _probe(base: Path) -> str | None:
    """Move a throwaway child into a new cgroup under ``base``; None if that worked."""
    cg = base / f"probe{os.getpid()}"
    try:
        cg.mkdir()
    except OSError as exc:
        return f"cannot create a cgroup under {base}: {exc.strerror or exc}"
    try:
        res = subprocess.run(["/bin/sh", "-c", ENTER, str(cg / "cgroup.procs"), "true"],
                             capture_output=True, text=True, timeout=10)
        if res.returncode != 0:
            return (f"cannot move a process into a cgroup under {base}: "
                    f"{res.stderr.strip() or f'exit {res.returncode}'}")
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run the cgroup probe: {exc}"
    finally:
        _rmdir(cg)


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
    own, why = cgroup2_dir()
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
        why = _probe(base) or ""
        if why:
            _rmdir(base)
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
            + ("cgroup.kill" if kill_file else "freeze + SIGKILL of every member"))
    return Containment("cgroup", note, base, [p for p in previous if p != base], kill_file)


def _previous_bases(state_dir: Path) -> list[Path]:
    try:
        doc = json.loads((state_dir / STATE_FILE).read_text())
        return [Path(p) for p in doc.get("bases", []) if isinstance(p, str)]
    except (OSError, ValueError, AttributeError):
        return []


_current = Containment("process-group", "cgroups not used (not installed)")


def install(box: Containment) -> None:
    """Make ``box`` the one ``procs.spawn`` and ``procs.end_group`` use (once, at start)."""
    global _current
    _current = box


def current() -> Containment:
    return _current


# --- ending a cgroup --------------------------------------------------------------------------


def populated(cg: Path) -> bool:
    """Whether any live process is in ``cg`` or below it."""
    try:
        for line in (cg / "cgroup.events").read_text().splitlines():
            if line.startswith("populated "):
                return line.split()[1] == "1"
    except OSError:
        return False
    return bool(_pids(cg))


def _pids(cg: Path) -> list[int]:
    """Every pid in ``cg`` and its descendant cgroups."""
    out: list[int] = []
    for dirpath, _dirs, _files in os.walk(cg):
        with contextlib.suppress(OSError, ValueError):
            out += [int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()]
    return out


def _signal_all(cg: Path, sig: int) -> None:
    for pid in _pids(cg):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _kill(cg: Path) -> None:
    kill = cg / "cgroup.kill"
    if kill.exists():
        with contextlib.suppress(OSError):
            kill.write_text("1")
            return
    # Before cgroup.kill: frozen members cannot fork while we SIGKILL them one by one.
    freeze = cg / "cgroup.freeze"
    with contextlib.suppress(OSError):
        freeze.write_text("1")
    _signal_all(cg, signal.SIGKILL)
    with contextlib.suppress(OSError):
        freeze.write_text("0")


def _rmdir(cg: Path) -> bool:
    """Remove ``cg`` and its (empty) descendants, deepest first."""
    ok = True
    if not cg.is_dir():
        return True
    for dirpath, _dirs, _files in sorted(os.walk(cg), key=lambda t: -len(t[0])):
        try:
            os.rmdir(dirpath)
        except FileNotFoundError:
            pass
        except OSError as exc:
            ok = False
            log.debug("cannot remove cgroup %s: %s", dirpath, exc)
    return ok


async def end_cgroup(cg: Path, grace_s: float, *, pgid: int | None = None,
                     pgid_alive: Any = None) -> bool:
    """SIGTERM every member of ``cg`` (and of process group ``pgid``), wait up to ``grace_s``
    for both to empty, then kill what is left; remove the cgroup. True if it had to kill.

    ``pgid_alive`` (a callable) says whether the process group still has members of ours."""
    def live() -> bool:
        return populated(cg) or bool(pgid is not None and pgid_alive and pgid_alive())

    def signal_group(sig: int) -> None:
        if pgid is not None and pgid_alive and pgid_alive():  # ours, not a reused number
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)

    killed = False
    if live():
        _signal_all(cg, signal.SIGTERM)
        signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        delay = 0.01
        while live() and time.monotonic() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
        if live():
            killed = True
            _kill(cg)
            signal_group(signal.SIGKILL)
            for _ in range(100):  # SIGKILL cannot be refused; the kernel tears them down
                if not live():
                    break
                await asyncio.sleep(0.02)
    for _ in range(25):
        if _rmdir(cg) or not cg.exists():
            break
        await asyncio.sleep(0.02)  # exiting members still counted for a moment
    return killed
