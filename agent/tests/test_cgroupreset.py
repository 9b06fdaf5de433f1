"""The keep-services drop-in's ExecStartPre (platform/linux/cgroupreset.py): which cgroup is
the unit's, and that a subtree gives its controllers back deepest first. Where the kernel's
cgroup2 is writable here (root), on a real cgroup subtree made for the test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from oarbank_agent.platform.linux.cgroupreset import ROOT, give_back, unit_cgroup


def test_the_units_cgroup_is_the_control_processes_parent() -> None:
    line = "0::/system.slice/oarbank-agent.service/.control\n"
    assert unit_cgroup(line) == ROOT / "system.slice/oarbank-agent.service"
    assert unit_cgroup("0::/system.slice/x.service\n") == ROOT / "system.slice/x.service"
    assert unit_cgroup("12:memory:/x\n") is None  # cgroup v1 only: nothing to give back


def _own() -> Path | None:
    found = unit_cgroup(Path("/proc/self/cgroup").read_text())
    if found is None or os.geteuid() != 0 or not (found / "cgroup.controllers").exists():
        return None
    return found


@pytest.fixture
def subtree() -> Iterator[Path]:
    own = _own()
    if own is None:
        pytest.skip("needs root and a unified cgroup v2 tree at /sys/fs/cgroup "
                    "(this host: not both)")
    parent = own.parent  # a sibling of our own cgroup: ours holds this process
    top = parent / f"oarbank-test-reset-{os.getpid()}"
    try:
        (top / "a" / "b").mkdir(parents=True)
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup next to {own}: {exc}")
    yield top
    for cg in (top / "a" / "b", top / "a", top):
        cg.rmdir()


def test_a_real_subtree_gives_its_controllers_back_deepest_first(subtree: Path) -> None:
    offered = set((subtree / "cgroup.controllers").read_text().split()) & {"memory", "cpu",
                                                                          "pids"}
    if not offered:
        pytest.skip("no controller offered to a new cgroup here")
    want = " ".join(f"+{c}" for c in sorted(offered))
    for cg in (subtree, subtree / "a"):  # as the agent enables them: top first
        (cg / "cgroup.subtree_control").write_text(want)
    # The top cannot give them back while its child still gives them on: the order matters.
    with pytest.raises(OSError):
        (subtree / "cgroup.subtree_control").write_text(
            " ".join(f"-{c}" for c in sorted(offered)))
    done = give_back(subtree)
    assert [line.split(":", 1)[0] for line in done] == [str(subtree / "a"), str(subtree)]
    for cg in (subtree, subtree / "a", subtree / "a" / "b"):
        assert (cg / "cgroup.subtree_control").read_text().split() == []
