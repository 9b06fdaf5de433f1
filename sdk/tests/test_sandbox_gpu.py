"""What a GPU child (``wrap(..., gpu=True)``: a module with ``[sandbox].devices.gpu =
"compute"``) may do beyond the others: exactly what NVIDIA's CUDA driver needs to initialise
(``_policy.GPU_SOCKET_*``, ``GPU_PROC_WRITE``; measured on an H200, docs/contract-map.md G15),
and nothing that reaches outside its sandbox. Real launches of the real launcher; this machine
has no GPU, so the driver's calls are made by hand, the way its ``cuInit`` makes them."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import run_in_own_group

from oarbank_sdk import sandbox

pytestmark = pytest.mark.skipif(
    sys.platform == "win32", reason="the GPU walls are the Linux launcher's (seccomp, abstract "
                                    "sockets, /proc, process groups)")

# The driver's own calls (an abstract SOCK_SEQPACKET listener, a write under
# /proc/self/task/<tid>), then every way out a GPU child must still not have.
DRIVER_AND_ESCAPES = textwrap.dedent(r"""
    import errno, json, os, socket, sys
    out = {}
    def attempt(name, fn):
        try:
            result = fn()
        except OSError as exc:
            out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
            return None
        out[name] = "ok"
        return result
    name = b"\0cuda-uvmfd-test-%d" % os.getpid()
    listener = attempt("socket_unix_seqpacket",
                       lambda: socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
    if listener is not None:
        attempt("bind_abstract", lambda: listener.bind(name))
        attempt("listen", lambda: listener.listen(1))
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        attempt("connect_to_it", lambda: peer.connect(name))
        path_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        attempt("bind_path", lambda: path_socket.bind(os.path.join(sys.argv[1], "sock")))
    attempt("socket_unix_dgram", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
    attempt("socket_inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    attempt("socket_inet6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
    attempt("socket_netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
    def write(path, text):
        with open(path, "w") as f:
            f.write(text)
    attempt("write_own_task", lambda: write(f"/proc/self/task/{os.getpid()}/comm", "gpu"))
    attempt("write_sysctl", lambda: write("/proc/sys/kernel/domainname", "(none)"))
    print(json.dumps(out))
""")

# (A sysctl write is refused by Landlock or the file's mode, EACCES, or by a read-only /proc/sys
# where the machine mounts it so, EROFS, as Docker does: either way, not written.)
ESCAPES_REFUSED = {"socket_unix_dgram": "EPERM", "socket_inet": "EPERM",
                   "socket_inet6": "EPERM", "socket_netlink": "EPERM",
                   "write_sysctl": "refused"}


def escapes(got: dict) -> dict:
    """The escape attempts' answers, a sysctl write's refusal whatever its errno."""
    out = {k: got[k] for k in ESCAPES_REFUSED}
    if out["write_sysctl"] in ("EACCES", "EROFS"):
        out["write_sysctl"] = "refused"
    return out


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder another user can use (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="oarbank-gpu-"))
    path.chmod(0o777)
    (path / "driver.py").write_text(DRIVER_AND_ESCAPES)
    (path / "driver.py").chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _readable_import_dirs(argv: list[str], shared: Path) -> list[str]:
    """``argv`` with the launcher importing from copies in ``shared``: the checkout and this
    interpreter's site-packages may be private to their owner (a clone under /root)."""
    at = argv.index(sandbox.LAUNCHER_BOOT) + 1  # the two folders it imports from follow
    sdk_dir, seccomp_dir = argv[at:at + 2]
    lib = shared / "lib"
    shutil.copytree(Path(sdk_dir) / "oarbank_sdk", lib / "sdk" / "oarbank_sdk", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (lib / "seccomp").mkdir(exist_ok=True)
    shutil.copy(Path(seccomp_dir) / "pyseccomp.py", lib / "seccomp")
    for path in [lib, *lib.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return [*argv[:at], str(lib / "sdk"), str(lib / "seccomp"), *argv[at + 2:]]


def _launch(shared: Path, gpu: bool, python: str, as_user: int | None = None) -> dict:
    argv = sandbox.launcher_argv(python=python, read=[shared / "driver.py"], write=[shared],
                                 gpu=gpu) + [python, "-I", str(shared / "driver.py"), str(shared)]
    if as_user is not None:
        argv = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--clear-groups",
                *_readable_import_dirs(argv, shared)]
    done = run_in_own_group(argv)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_gpu_child_listens_on_an_abstract_name_and_still_reaches_nothing(shared_dir) -> None:
    got = _launch(shared_dir, True, sys.executable)
    # the driver's socket: AF_UNIX, connection-oriented, an abstract name, listening
    assert {k: got[k] for k in ("socket_unix_seqpacket", "bind_abstract", "listen")} == {
        "socket_unix_seqpacket": "ok", "bind_abstract": "ok", "listen": "ok"}, got
    assert got["connect_to_it"] == "EPERM", got  # nobody connects, not even itself
    assert got["bind_path"] == "EACCES", got  # no socket gets a name in the filesystem
    assert escapes(got) == ESCAPES_REFUSED, got
    # /proc is written only by a non-root GPU child (next test); a root one gets none of it
    assert got["write_own_task"] == ("EACCES" if os.geteuid() == 0 else "ok"), got


def test_without_the_gpu_every_socket_stays_refused(shared_dir) -> None:
    got = _launch(shared_dir, False, sys.executable)
    assert got["socket_unix_seqpacket"] == "EPERM", got
    assert got["write_own_task"] == "EACCES", got
    assert escapes(got) == ESCAPES_REFUSED, got


def test_a_non_root_gpu_child_writes_its_own_proc_task_and_no_sysctl(shared_dir) -> None:
    if os.geteuid() != 0:
        python, user = sys.executable, None  # already not root
    else:
        # Another user cannot run this interpreter when it lives under /root: the system's.
        python = "/usr/bin/python3"
        if not os.access(python, os.X_OK) or shutil.which("setpriv") is None:
            pytest.skip("needs /usr/bin/python3 and setpriv (Debian: python3, util-linux) to "
                        "run a child as another user")
        user = 65534
    got = _launch(shared_dir, True, python, as_user=user)
    assert got["write_own_task"] == "ok", got
    assert got["listen"] == "ok" and got["connect_to_it"] == "EPERM", got
    assert escapes(got) == ESCAPES_REFUSED, got
    # and a non-GPU child of the same user writes none of /proc
    assert _launch(shared_dir, False, python, as_user=user)["write_own_task"] == "EACCES"
