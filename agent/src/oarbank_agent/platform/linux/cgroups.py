"""cgroup v2, the mechanism: find the agent's own cgroup, move a child into a new one before
its code runs, end every member of one, remove it. Which groups get a cgroup, and when the
agent uses cgroups at all, is ``containment``'s policy.

A child enters its cgroup through ``enter_argv``: ``/bin/sh -c 'echo $$ > <cg>/cgroup.procs;
exec "$@"'`` in front of its argv, so nothing can fork out before the move. Ending a cgroup:
SIGTERM to every member, a grace period, then ``cgroup.kill`` (Linux 5.14+) or, before it,
freeze + SIGKILL of every member + thaw (frozen members cannot fork meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["ENTER", "cgroup2_dir", "probe", "enter_argv", "populated", "pids", "signal_all",
           "kill", "remove", "end_cgroup"]

log = logging.getLogger("oarbank_agent.sandbox.containment")

# The child moves itself, then becomes argv. `unset PWD`: the shell exports PWD on its own, and
# a child's environment is exactly the contract's (nothing the wrapper adds survives the exec).
ENTER = 'echo $$ > "$0" || exit 125; unset PWD; exec "$@"'


def enter_argv(argv: list[str], cg: Path) -> list[str]:
    """``argv`` run inside cgroup ``cg`` from its first instruction."""
    return ["/bin/sh", "-c", ENTER, str(cg / "cgroup.procs"), *argv]


def _cgroup2_mount(mountinfo: str) -> tuple[list[str], list[str]] | None:
    """The first cgroup2 line of ``mountinfo``: its fields before and after the " - "."""
    for line in mountinfo.splitlines():
        pre, _, post = line.partition(" - ")
        if post.split(" ", 1)[0] == "cgroup2":
            return pre.split(), post.split()
    return None


def cgroup2_dir() -> tuple[Path | None, str]:
    """The agent's own cgroup v2 directory, or None and why not."""
    if not sys.platform.startswith("linux"):
        return None, f"cgroups do not exist on {sys.platform}"
    try:
        with open("/proc/self/mountinfo") as f:
            found = _cgroup2_mount(f.read())
    except OSError as exc:
        return None, f"cannot read /proc/self/mountinfo: {exc}"
    if found is None:
        return None, "no cgroup v2 file system is mounted"
    root, mount = found[0][3], found[0][4]
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


def favors_dynmods(mountinfo: str) -> bool:
    """Whether the cgroup2 mount in ``mountinfo`` (``/proc/self/mountinfo``'s text) has the
    ``favordynmods`` super option. Without it every move of a process into a cgroup waits for
    an RCU grace period on the threadgroup lock, which is global to all hierarchies: 8.7 ms
    median per child measured on a 2-core VM, 0.3 ms with it
    (docs/measurements/2026-12-02-per-connect-and-per-job-cost.md)."""
    found = _cgroup2_mount(mountinfo)
    return found is not None and len(found[1]) >= 3 and "favordynmods" in found[1][2].split(",")


def moves_note() -> str:
    """How costly a child's move into its cgroup is here, for the containment's note."""
    try:
        with open("/proc/self/mountinfo") as f:
            fast = favors_dynmods(f.read())
    except OSError:
        fast = False
    return ("cgroup2 mounted with favordynmods (a child's move into its cgroup is cheap)"
            if fast else
            "cgroup2 mounted without favordynmods: each child's move into its cgroup waits "
            "for an RCU grace period (about 9 ms measured); remounting it with "
            "favordynmods cuts that to about 0.3 ms")


def probe(base: Path) -> str | None:
    """Move a throwaway child into a new cgroup under ``base``; None if that worked."""
    cg = base / f"probe{os.getpid()}"
    try:
        cg.mkdir()
    except OSError as exc:
        return f"cannot create a cgroup under {base}: {exc.strerror or exc}"
    try:
        res = subprocess.run(enter_argv(["true"], cg),
                             capture_output=True, text=True, timeout=10)
        if res.returncode != 0:
            return (f"cannot move a process into a cgroup under {base}: "
                    f"{res.stderr.strip() or f'exit {res.returncode}'}")
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run the cgroup probe: {exc}"
    finally:
        remove(cg)


def populated(cg: Path) -> bool:
    """Whether any live process is in ``cg`` or below it."""
    try:
        for line in (cg / "cgroup.events").read_text().splitlines():
            if line.startswith("populated "):
                return line.split()[1] == "1"
    except OSError:
        return False
    return bool(pids(cg))


def pids(cg: Path) -> list[int]:
    """Every pid in ``cg`` and its descendant cgroups."""
    out: list[int] = []
    for dirpath, _dirs, _files in os.walk(cg):
        with contextlib.suppress(OSError, ValueError):
            out += [int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()]
    return out


def signal_all(cg: Path, sig: int) -> None:
    """Send ``sig`` to every member of ``cg`` and of its descendants."""
    for pid in pids(cg):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill(cg: Path) -> None:
    """SIGKILL every member of ``cg`` at once."""
    kill_file = cg / "cgroup.kill"
    if kill_file.exists():
        with contextlib.suppress(OSError):
            kill_file.write_text("1")
            return
    # Before cgroup.kill: frozen members cannot fork while we SIGKILL them one by one.
    freeze = cg / "cgroup.freeze"
    with contextlib.suppress(OSError):
        freeze.write_text("1")
    signal_all(cg, signal.SIGKILL)
    with contextlib.suppress(OSError):
        freeze.write_text("0")


def remove(cg: Path) -> bool:
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
        signal_all(cg, signal.SIGTERM)
        signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        delay = 0.01
        while live() and time.monotonic() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
        if live():
            killed = True
            kill(cg)
            signal_group(signal.SIGKILL)
            for _ in range(100):  # SIGKILL cannot be refused; the kernel tears them down
                if not live():
                    break
                await asyncio.sleep(0.02)
    for _ in range(25):
        if remove(cg) or not cg.exists():
            break
        await asyncio.sleep(0.02)  # exiting members still counted for a moment
    return killed
