"""Before the agent's unit starts again with kept services in its cgroup (``--keep-services``
under systemd, agent/systemd/keep-services.conf): give the controllers back, deepest cgroup
first, so systemd can put the new agent into the unit's cgroup.

Why: the previous agent enabled the memory and cpu controllers for its children
(``limits.py``), and cgroup v2 puts no process into a cgroup that gives controllers to its
children. With ``KillMode=process`` the kept services are still in the unit's subtree when
it starts again, so systemd's attach of the new main process fails (status 219/CGROUP) until
the subtree gives them back. The new agent enables them again at its start (``limits.setup``).
Run by systemd as root (``ExecStartPre=+``) in the unit's ``.control`` cgroup (a delegated
unit's control processes go there); standard library only.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["unit_cgroup", "give_back", "main"]

ROOT = Path("/sys/fs/cgroup")


def unit_cgroup(proc_self_cgroup: str, root: Path = ROOT) -> Path | None:
    """The unit's cgroup, from this process's ``/proc/self/cgroup`` (cgroup v2's ``0::``
    line); a delegated unit's control process runs in its ``.control`` child (pure)."""
    for line in proc_self_cgroup.splitlines():
        if line.startswith("0::/"):
            here = root / line[4:].strip()
            return here.parent if here.name == ".control" else here
    return None


def give_back(unit: Path) -> list[str]:
    """Disable every controller each cgroup of ``unit``'s subtree gives its children, the
    deepest first (a parent's cannot go while a child still gives it on). What it did."""
    found = [unit, *(d for d in unit.rglob("*") if d.is_dir())]
    done = []
    for cg in sorted(found, key=lambda d: len(d.parts), reverse=True):
        ctl = cg / "cgroup.subtree_control"
        try:
            enabled = ctl.read_text().split()
            if enabled:
                ctl.write_text(" ".join(f"-{c}" for c in enabled))
                done.append(f"{cg}: -{' -'.join(enabled)}")
        except FileNotFoundError:
            continue  # gone meanwhile, or not a cgroup
    return done


def main() -> int:
    unit = unit_cgroup(Path("/proc/self/cgroup").read_text())
    if unit is None:
        print("cgroupreset: no cgroup v2 line in /proc/self/cgroup: nothing to do",
              file=sys.stderr)
        return 0
    try:
        done = give_back(unit)
    except OSError as exc:  # the start then fails and says why; this says what came first
        print(f"cgroupreset: {unit}: {exc}", file=sys.stderr)
        return 1
    for line in done:
        print(f"cgroupreset: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
