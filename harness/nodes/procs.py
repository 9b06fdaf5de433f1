"""Finding and ending the processes of a run on this machine (the local backend).

A node's processes are found two ways, so that nothing escapes the "nothing left" check:
- on Linux the harness makes itself a child subreaper, so whatever a node starts and orphans
  (a service left behind by a `kill -9`ed agent) is re-parented to the harness, and is found
  among its descendants;
- on every OS, any process whose command line or working directory lies under the node's own
  directory (modules are copied there, so every op, service and runner names it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = ["ProcInfo", "OWNED", "become_subreaper", "processes_under", "end_processes",
           "reap_children"]

_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    pgid: int | None
    cmdline: str

    def __str__(self) -> str:
        return f"pid {self.pid} (group {self.pgid}): {self.cmdline[:160]}"


def become_subreaper() -> bool:
    """Orphans of our descendants come back to us instead of to init (Linux only)."""
    if sys.platform != "linux":
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return False


def _info(p: psutil.Process) -> ProcInfo | None:
    try:
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        cmd = " ".join(p.cmdline()) or p.name()
        pgid = os.getpgid(p.pid) if hasattr(os, "getpgid") else None
        return ProcInfo(p.pid, pgid, cmd)
    except (psutil.Error, OSError):
        return None


def processes_under(root: Path, *, also: set[int] = frozenset()) -> list[ProcInfo]:  # type: ignore[assignment]
    """Live processes that belong to `root` (see the module doc), plus pids in `also` when
    still alive. Zombies are not processes any more and are left out."""
    root_s = str(root.resolve())
    me = os.getpid()
    found: dict[int, ProcInfo] = {}
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            hit = p.pid in also
            if not hit:
                cmd = " ".join(p.cmdline())
                hit = root_s in cmd
            if not hit:
                with contextlib.suppress(psutil.Error, OSError):
                    hit = p.cwd().startswith(root_s)
        except (psutil.Error, OSError):
            continue
        if hit:
            info = _info(p)
            if info:
                found[p.pid] = info
    return sorted(found.values(), key=lambda i: i.pid)


def end_processes(procs: list[ProcInfo], grace_s: float = 3.0) -> None:
    """SIGTERM each process's group (or the process), then SIGKILL what is left."""
    ps = []
    for info in procs:
        with contextlib.suppress(psutil.Error):
            ps.append(psutil.Process(info.pid))
    for p in ps:
        with contextlib.suppress(psutil.Error, OSError):
            p.terminate()
    _, alive = psutil.wait_procs(ps, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error, OSError):
            if hasattr(os, "killpg"):
                os.killpg(os.getpgid(p.pid), signal.SIGKILL)
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    reap_children()


# Children the harness waits for itself (subprocess.Popen): never reaped behind their back,
# or Popen would lose their exit status.
OWNED: set[int] = set()


def reap_children() -> None:
    """Collect exited orphans that were re-parented to us (we are a subreaper)."""
    if not hasattr(os, "waitpid"):
        return
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            if child.pid in OWNED:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
