"""``clone3(CLONE_INTO_CGROUP)`` (factory/intocgroup.py): the child is born in the cgroup it
is given, before any of its own code runs, and the interpreter in both processes carries on
as after ``os.fork``; where the cgroup is not a cgroup2 directory the caller is told to fork
the old way. Real cgroups of this machine, in a fresh single-threaded interpreter (as the
factory is)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.linux_only("clone3 and cgroup v2 are Linux's")

# The child reports its cgroup, that a thread and an import still work after the fork (the
# interpreter's after-fork state), and exits; the parent reaps it and reports what it saw.
SCRIPT = r"""
import json, os, sys, threading
from oarbank_agent.platform.linux.factory import intocgroup
r, w = os.pipe()
pid = intocgroup.fork_into(sys.argv[1])
if pid == 0:
    os.close(r)
    cg = [l[3:].strip() for l in open("/proc/self/cgroup") if l.startswith("0::")][0]
    t = threading.Thread(target=lambda: None); t.start(); t.join()
    import email.utils  # the import lock was reset in the child
    os.write(w, json.dumps({"cgroup": cg, "pid": os.getpid()}).encode())
    os._exit(7)
if pid is None:
    print(json.dumps({"fell_back": True}))
    sys.exit(0)
os.close(w)
got = json.loads(os.read(r, 4096) or b"{}")
_, status = os.waitpid(pid, 0)
print(json.dumps({"child": got, "pid": pid, "code": os.waitstatus_to_exitcode(status)}))
"""


def _run(target: str) -> dict:
    out = subprocess.run([sys.executable, "-I", "-c", SCRIPT, target], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def cgroup() -> Path:
    from oarbank_agent.platform.linux import cgroups

    own, why = cgroups.cgroup2_dir()
    if own is None:
        pytest.skip(f"no cgroup v2 here: {why}")
    cg = own / f"intocgroup-{uuid.uuid4().hex[:8]}"
    try:
        cg.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup under {own} ({exc.strerror}): needs root or a "
                    "delegated cgroup")
    yield cg
    cgroups.remove(cg)


def test_the_child_is_born_in_its_cgroup(cgroup: Path) -> None:
    seen = _run(str(cgroup))
    assert "fell_back" not in seen, "clone3(CLONE_INTO_CGROUP) refused on this kernel"
    mount = next(ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
                 if " - cgroup2 " in ln)
    assert seen["code"] == 7 and seen["child"]["pid"] == seen["pid"], seen
    assert Path(mount, seen["child"]["cgroup"].lstrip("/")) == cgroup, seen
    assert not (cgroup / "cgroup.procs").read_text().split()  # reaped: the group is empty


def test_not_a_cgroup_dir_falls_back_to_fork(tmp_path: Path) -> None:
    assert _run(str(tmp_path)) == {"fell_back": True}  # a plain folder: EBADF from clone3
    assert _run(str(tmp_path / "missing")) == {"fell_back": True}


def test_no_descriptor_is_left_open(cgroup: Path) -> None:
    """The cgroup's descriptor is closed in both processes (a script run in place by the
    factory's child must not inherit it)."""
    code = ("import os, sys\n"
            "from oarbank_agent.platform.linux.factory import intocgroup\n"
            "before = sorted(os.listdir('/proc/self/fd'))\n"
            "pid = intocgroup.fork_into(sys.argv[1])\n"
            "now = sorted(os.listdir('/proc/self/fd'))\n"
            "if pid == 0:\n"
            "    os._exit(0 if now == before else 3)\n"
            "_, st = os.waitpid(pid, 0)\n"
            "print(os.waitstatus_to_exitcode(st), now == before)\n")
    out = subprocess.run([sys.executable, "-I", "-c", code, str(cgroup)], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split() == ["0", "True"], (out.stdout, out.stderr)
