"""The sandbox every runner, service op and service daemon runs in (and all they start).

Public API::

    wrap(argv, *, net="none") -> list[str]      # launcher prefix + argv, to hand to Popen
    capabilities() -> dict[str, str]            # each CAPABILITY_NAMES entry: "enforced"/"unavailable"
    available() -> bool                         # the launcher can confine a child here
    EXIT_SETUP_FAILED = 70, EXIT_EXEC_FAILED = 71

For whoever starts and watches confined children (the agent, its process factory)::

    parse_launch_args(args) -> LaunchRequest    # the launcher's options (UsageError if bad)
    LAUNCHER_BOOT                               # the launcher's ``-c`` code in ``wrap``'s argv
    LAUNCHER_PREFIX                             # starts the launcher's one refusal line
    preload(guard_pids)                         # a forking parent: imports and filters, once
    landlock_abi() -> int                       # the kernel's Landlock ABI (0: none)
    notify_probe() -> str | None                # None: network attempts can be watched here
    notify_session(sock, record) -> NotifySession   # one launch's watch, driven by its owner

The launcher is ``python -I -m oarbank_sdk.sandbox.launch [--net none] -- ARGV...`` (``wrap``
uses an equivalent site-less ``-I -S -c`` form that starts faster); see
``launch`` for its behaviour and exit codes, ``_policy`` for exactly what is refused and why,
``_linux`` for how, ``_seatbelt`` for macOS. ``capabilities()`` is measured, not assumed: it
runs the launcher once on a probe child (``_probe``) and caches the answer for the process.

This package may import ``pyseccomp``; ``oarbank_sdk.service_endpoint`` must never import it
(nor this package).
"""

from __future__ import annotations

import _thread
import os
import sys

from ._policy import (
    CAPABILITY_NAMES,
    ENFORCED,
    EXIT_EXEC_FAILED,
    EXIT_SETUP_FAILED,
    FAULT_ENV,
    GPU_DEVICES_GLOBS,
    LAUNCHER_PREFIX,
    NET_MODES,
    SIGNAL_MODES,
    UNAVAILABLE,
    WALL_GAPS,
    LaunchRequest,
    UsageError,
    derive_capabilities,
    parse_launch_args,
)

TYPE_CHECKING = False  # not `typing`: the launcher imports this package on every start
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Iterable

    from ._notify import Attempt
    from ._notify import Session as NotifySession

__all__ = [
    "wrap",
    "capabilities",
    "available",
    "launcher_argv",
    "EXIT_SETUP_FAILED",
    "EXIT_EXEC_FAILED",
    "CAPABILITY_NAMES",
    "ENFORCED",
    "UNAVAILABLE",
    "FAULT_ENV",
    "WALL_GAPS",
    "gpu_devices",
    "LaunchRequest",
    "UsageError",
    "parse_launch_args",
    "LAUNCHER_BOOT",
    "LAUNCHER_PREFIX",
    "preload",
    "landlock_abi",
    "last_capability",
    "notify_probe",
    "notify_session",
]

_PROBE_TIMEOUT_S = 30.0
_lock = _thread.allocate_lock()
_cached: dict[str, str] | None = None


# The launcher runs with -S (no site: it is the bulk of an interpreter start, ~100 ms on a
# loaded machine) and gets the two folders it imports from as its first two arguments. Public:
# the agent's process factory recognises a launcher argv by it.
LAUNCHER_BOOT = (
    "import sys;sys.path.insert(0,sys.argv.pop(1));sys.path.append(sys.argv.pop(1));"
    "from oarbank_sdk.sandbox.launch import main;sys.exit(main())"
)


_dirs: tuple[str, str] | None = None


def _import_dirs() -> tuple[str, str] | None:
    """Folders holding oarbank_sdk and pyseccomp, or None to let site find them."""
    global _dirs
    if _dirs is None:
        # Imported here, not at the top: the launcher imports this package on every start.
        import importlib.util

        sdk_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        spec = importlib.util.find_spec("pyseccomp") if sys.platform.startswith("linux") else None
        if sys.platform.startswith("linux") and (spec is None or not spec.origin):
            return None  # the launcher will report the missing binding itself (exit 70)
        seccomp_dir = os.path.dirname(os.path.abspath(spec.origin)) if spec and spec.origin else sdk_dir
        _dirs = (sdk_dir, seccomp_dir)
    return _dirs


def gpu_devices() -> list[str]:
    """The GPU device nodes present here (``/dev/nvidia*``, ``/dev/dri``, ``/dev/kfd``): what
    ``gpu=True`` grants."""
    import glob

    return sorted({p for pattern in GPU_DEVICES_GLOBS for p in glob.glob(pattern)})


def launcher_argv(*, net: str = "none", python: str | None = None,
                  notify_fd: int | None = None, read: Iterable[str | os.PathLike] = (),
                  write: Iterable[str | os.PathLike] = (), gpu: bool = False,
                  signals: str = "scoped", guard_pids: Iterable[int] = ()) -> list[str]:
    """The launcher's command prefix (everything before the child's argv). ``notify_fd``: a
    descriptor the child inherits (``pass_fds``), the launcher's end of a ``_notify.Watch``:
    the watch then sees every network attempt (see ``_notify``).

    Filesystem walls (Landlock): the child reads the system's folders, the Python installation
    and ``read`` (read + execute); writes only ``write``; opens /dev/null, zero, full, random,
    urandom and, with ``gpu``, the GPU nodes. ``signals="scoped"``: no signal to a process
    outside its own sandbox ("open": a service's ops, whose ``stop`` signals the daemon another
    op started). ``guard_pids`` (the agent): no signal to them or their process group either way.
    """
    if net not in NET_MODES:
        raise ValueError(f"unsupported net mode {net!r} (supported: {', '.join(NET_MODES)})")
    if signals not in SIGNAL_MODES:
        raise ValueError(f"unsupported signals mode {signals!r} (one of: {', '.join(SIGNAL_MODES)})")
    exe = python or sys.executable
    opts = ["--net", net] + ([] if notify_fd is None else ["--notify-fd", str(notify_fd)])
    for option, paths in (("--read", read), ("--write", write),
                          ("--dev", gpu_devices() if gpu else ())):
        for path in paths:
            opts += [option, os.path.abspath(os.fspath(path))]
    if gpu:
        opts.append("--gpu")  # the driver's own needs besides the nodes (_policy.GPU_*)
    if signals != "scoped":
        opts += ["--signals", signals]
    for pid in guard_pids:
        opts += ["--guard-pid", str(int(pid))]
    dirs = _import_dirs()
    if dirs is None:
        return [exe, "-I", "-m", "oarbank_sdk.sandbox.launch", *opts, "--"]
    return [exe, "-I", "-S", "-c", LAUNCHER_BOOT, *dirs, *opts, "--"]


def wrap(argv: list[str], *, net: str = "none", notify_fd: int | None = None,
         read: Iterable[str | os.PathLike] = (), write: Iterable[str | os.PathLike] = (),
         gpu: bool = False, signals: str = "scoped", guard_pids: Iterable[int] = ()) -> list[str]:
    """``argv`` run inside the sandbox: pass the result to ``subprocess.Popen`` as is.

    The launcher execs ``argv`` in place, so the pid, process group, inherited descriptors
    (``pass_fds``), environment and working folder are those the caller gives the Popen.
    ``notify_fd``: see ``launcher_argv`` (it must be in the Popen's ``pass_fds``), as for
    ``read``, ``write``, ``gpu``, ``signals`` and ``guard_pids``. Nothing outside the system's
    folders is readable and nothing at all writable unless given here.
    """
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("wrap() needs a non-empty list of strings")
    return [*launcher_argv(net=net, notify_fd=notify_fd, read=read, write=write, gpu=gpu,
                           signals=signals, guard_pids=guard_pids), *argv]


def _netns_of_self() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def _probe() -> dict[str, str]:
    # Imported here: the launcher imports this package and should start as fast as it can.
    import json
    import shutil
    import subprocess
    import tempfile

    # Same environment as every real launch (including a FAULT_ENV someone left set): the
    # report must say what launches here actually get. Two empty folders: one the launcher is
    # told to make writable, one it is not.
    granted = tempfile.mkdtemp(prefix="oarbank-probe-w-")
    outside = tempfile.mkdtemp(prefix="oarbank-probe-o-")
    argv = wrap([sys.executable, "-I", "-m", "oarbank_sdk.sandbox._probe", _netns_of_self(),
                 granted, outside, str(os.getpid())], write=[granted])
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            start_new_session=True,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return derive_capabilities(None, sys.platform)
    finally:
        shutil.rmtree(granted, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)
    if done.returncode != 0:
        return derive_capabilities(None, sys.platform)
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return derive_capabilities(None, sys.platform)
    return derive_capabilities(result, sys.platform)


def capabilities(*, refresh: bool = False) -> dict[str, str]:
    """Each sandbox capability as really observed on this machine (probed once, cached)."""
    global _cached
    with _lock:
        if _cached is None or refresh:
            _cached = _probe()
        return dict(_cached)


def available() -> bool:
    """True when the launcher confines a child here (no listening, no new sockets)."""
    caps = capabilities()
    if sys.platform == "darwin":
        return caps["macos_seatbelt"] == ENFORCED
    return all(caps[name] == ENFORCED for name in ("no_new_privs", "seccomp_listen", "seccomp_socket"))


def preload(guard_pids: Iterable[int] = (), launcher_sys_path: Iterable[str] | None = None) -> None:
    """For a process that forks children which then confine themselves (the agent's process
    factory): import what a launch imports and export its seccomp programs for ``guard_pids``
    now, once; each child loads its inherited copy instead of doing both again.
    ``launcher_sys_path``: ``sys.path`` of a ``python -I -S`` start (the launcher's before its two
    folders): the read list a child confining itself as that launcher would grants is resolved
    now too."""
    if sys.platform.startswith("linux"):
        from . import _landlock, _linux, _notify, launch  # noqa: F401  (imported: that is the point)

        dirs = _import_dirs() if launcher_sys_path is not None else None
        paths = () if dirs is None else ((dirs[0], *(launcher_sys_path or ()), dirs[1]),)
        _linux.prebuild(tuple(int(p) for p in guard_pids), paths)


def last_capability() -> int:
    """The highest capability number this kernel knows (63 when it does not say)."""
    from ._linux import last_capability as last

    return last()


def landlock_abi() -> int:
    """The Landlock ABI version of this kernel (0: no Landlock)."""
    from ._landlock import abi

    return abi()


def notify_probe() -> str | None:
    """None when network attempts of a confined child can be watched here (one real launch with
    a watch: one confined ``python -I -S -c pass``), else why not (the launcher's refusal, say on
    a kernel without user notification): the filter still refuses them, nobody counts them."""
    import subprocess

    from ._notify import Watch

    w = Watch(name="oarbank-notify-probe")
    child_fd = w.child_fd
    assert child_fd is not None  # a new watch holds it until spawned()
    try:
        argv = wrap([sys.executable, "-I", "-S", "-c", "pass"], notify_fd=child_fd)
        try:
            done = subprocess.run(argv, pass_fds=(child_fd,), capture_output=True, text=True,
                                  timeout=30, stdin=subprocess.DEVNULL, check=False)
        finally:
            w.spawned()
        if done.returncode != 0:
            return (done.stderr.strip() or f"exit {done.returncode}")[-300:]
        if w.take():
            return "the launcher's self-test was counted as an attempt"
        return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        w.close()


def notify_session(sock: socket.socket, record: Callable[[Attempt], None]) -> NotifySession:
    """The supervision of one launch with ``--notify-fd``, driven by its owner's event loop:
    ``sock`` is the supervisor's end of the pair, ``record`` gets each attempt (see
    ``_notify.Session`` for the calls the owner makes)."""
    from ._notify import Session

    return Session(sock, record)
