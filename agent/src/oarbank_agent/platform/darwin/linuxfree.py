"""The darwin profile's tripwire: on Linux, take from this process what macOS lacks, so that a
Linux-only call under ``OARBANK_PLATFORM=darwin`` fails loudly, naming the call.

Two halves. Attributes macOS's CPython does not have (``os.pipe2``, ``os.pidfd_open``,
``socket.SOCK_CLOEXEC``, ``select.epoll``...) are deleted from their modules, so a call raises
``AttributeError`` as it would there; what the standard library decided at import from them
is decided again as macOS's CPython does (``selectors.DefaultSelector`` becomes
``PollSelector``: macOS's is kqueue, which Linux has not, poll is what both have; 3.13's
``os.process_cpu_count`` is ``os.cpu_count``), so the interpreter's own calls keep working
and only ours fail. And an audit hook
(``sys.addaudithook``, which cannot be removed) refuses what has no attribute to delete:
opening or listing ``/proc`` and ``/sys/fs/cgroup``, importing ``pyseccomp``, looking up Linux
symbols through ``ctypes`` (``prctl``, ``syscall``, Landlock, seccomp), running Linux-only
tools (``setpriv``, ``unshare``...). The refusal is a ``LinuxOnlyCall``, whose message starts
with ``MESSAGE`` and names the call; it is no ``OSError`` on purpose, so that code which reads a
missing file as "absent" cannot swallow it: a call made is a bug to fix, never a quiet fallback.

psutil is exempt: on a Mac it reads the process table through ``libproc``, here through
``/proc``; what the agent asks of it is the same. The darwin backend installs this when it is
made (``platform.current()``): in the agent at its start, in its command line, and in the
tests' own processes (``agent/tests/conftest.py``); ``install`` is idempotent. Each refusal is
also written to stderr, so that one a caller swallows still shows in the agent's log.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["install", "installed", "LinuxOnlyCall", "MESSAGE", "REMOVED"]

MESSAGE = "linux-only call under the darwin profile"

# What macOS's CPython (3.10-3.13) lacks, by module; deleted where this Python has them.
REMOVED: dict[str, tuple[str, ...]] = {
    "os": ("pipe2", "pidfd_open", "P_PIDFD", "posix_fadvise", "posix_fallocate",
           "sched_setaffinity", "sched_getaffinity", "sched_setscheduler",
           "sched_getscheduler", "sched_setparam", "sched_getparam", "sched_rr_get_interval",
           "memfd_create", "eventfd", "eventfd_read", "eventfd_write", "splice",
           "copy_file_range", "getrandom", "getresuid", "getresgid", "setresuid", "setresgid",
           "getxattr", "setxattr", "listxattr", "removexattr", "fdatasync", "unshare", "setns",
           "O_PATH", "O_TMPFILE", "O_DIRECT", "O_NOATIME", "PIDFD_NONBLOCK"),
    "socket": ("SOCK_CLOEXEC", "SOCK_NONBLOCK", "MSG_CMSG_CLOEXEC", "SO_PEERCRED",
               "SO_PASSCRED", "SCM_CREDENTIALS", "SO_PEERSEC", "AF_NETLINK", "AF_PACKET",
               "AF_VSOCK", "SO_MARK", "SO_BINDTODEVICE"),
    "select": ("epoll",),
    "signal": ("pidfd_send_signal", "sigtimedwait", "sigwaitinfo", "SIGRTMIN", "SIGRTMAX",
               "SIGPWR", "SIGSTKFLT", "SIGPOLL", "SIGCLD"),
    "fcntl": ("F_ADD_SEALS", "F_GET_SEALS", "F_SETPIPE_SZ", "F_GETPIPE_SZ", "F_OFD_SETLK",
              "F_OFD_SETLKW", "F_OFD_GETLK", "F_NOTIFY", "F_SETLEASE", "F_GETLEASE"),
    "resource": ("prlimit", "RLIMIT_RTPRIO", "RLIMIT_RTTIME", "RLIMIT_MSGQUEUE", "RLIMIT_NICE",
                 "RLIMIT_SIGPENDING"),
    "time": ("CLOCK_BOOTTIME",),
}
# Families of Linux-only constants (os.EFD_*, select.EPOLL*...), by prefix.
_REMOVED_PREFIXES: dict[str, tuple[str, ...]] = {
    "os": ("EFD_", "MFD_", "GRND_", "RWF_", "SPLICE_F_", "POSIX_FADV_", "XATTR_"),
    "select": ("EPOLL",),
    "fcntl": ("F_SEAL_", "DN_"),
}

_PATHS = ("/proc", "/sys/fs/cgroup")
_SYMBOLS = frozenset({
    "prctl", "syscall", "seccomp", "seccomp_init", "seccomp_load", "seccomp_rule_add",
    "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "unshare",
    "setns", "pidfd_open", "pidfd_send_signal", "pipe2", "memfd_create", "eventfd",
    "epoll_create", "epoll_create1", "signalfd", "inotify_init1", "capset", "capget",
    "pivot_root", "mount", "umount2"})
_LIBRARIES = ("libseccomp", "libcap")
_MODULES = frozenset({"pyseccomp", "seccomp"})
_TOOLS = frozenset({"setpriv", "unshare", "nsenter", "systemd-run", "bwrap", "prlimit",
                    "taskset", "ionice", "cgexec"})
_EVENTS = frozenset({"open", "os.listdir", "os.scandir", "ctypes.dlopen", "ctypes.dlsym",
                     "import", "subprocess.Popen", "os.posix_spawn", "os.exec"})


class LinuxOnlyCall(RuntimeError):
    """A call macOS could not make, refused under the darwin profile (the message names it)."""


_installed = False
_exempt: tuple[str, ...] = ()


def installed() -> bool:
    return _installed


def install() -> None:
    """Take the Linux-only calls from this process (once; nothing can put them back)."""
    global _installed, _exempt
    if _installed:
        return
    if not sys.platform.startswith("linux"):
        return  # on a real Mac there is nothing to take: macOS has none of it
    _installed = True
    try:  # psutil stands in for libproc: loaded before what its Linux half reads at import goes
        import psutil  # noqa: F401
    except ImportError:
        pass
    for modname, names in REMOVED.items():
        mod = __import__(modname)
        prefixes = _REMOVED_PREFIXES.get(modname)
        family = [n for n in dir(mod) if n.startswith(prefixes)] if prefixes else []
        for attr in (*names, *family):
            if hasattr(mod, attr):
                delattr(mod, attr)
    _stdlib_as_on_macos()
    spec = importlib.util.find_spec("psutil")
    if spec is not None and spec.origin:
        _exempt = (str(Path(spec.origin).parent) + os.sep,)
    sys.addaudithook(_hook)


def _stdlib_as_on_macos() -> None:
    """What the standard library decided at import from what is now gone, decided as macOS's
    does: ``selectors`` picks poll (``_no_epoll_selector``); ``shutil`` copies no xattrs;
    ``tempfile`` does not try ``O_TMPFILE``; 3.13's ``os.process_cpu_count`` (the size of
    asyncio's and concurrent.futures' default pools) is ``os.cpu_count``, where Linux's counts
    the ``sched_getaffinity`` mask (a NameError once that is gone: no agent could start)."""
    _no_epoll_selector()
    if sys.version_info >= (3, 13):
        os.process_cpu_count = os.cpu_count
    shutil = sys.modules.get("shutil")
    if shutil is not None:
        shutil._copyxattr = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None and hasattr(tempfile, "_O_TMPFILE_WORKS"):
        tempfile._O_TMPFILE_WORKS = False  # type: ignore[attr-defined]


def _no_epoll_selector() -> None:
    import selectors

    if hasattr(selectors, "EpollSelector"):
        del selectors.EpollSelector
    selectors.DefaultSelector = selectors.PollSelector  # type: ignore[misc,assignment]


def _from_psutil() -> bool:
    if not _exempt:
        return False
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(_exempt):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _refuse(what: str) -> None:
    message = (f"{MESSAGE}: {what} (macOS has no such thing; ask the platform backend, "
               "oarbank_agent.platform)")
    # Said on stderr too (the agent's log): a caller that swallows the exception is still seen.
    try:
        sys.stderr.write(f"oarbank tripwire: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    raise LinuxOnlyCall(message)


def _linux_path(path: Any) -> str | None:
    if isinstance(path, int) or path is None:
        return None
    try:
        p = os.fsdecode(os.fspath(path))
    except TypeError:
        return None
    if not p.startswith("/"):
        p = os.path.join(os.getcwd(), p)
    p = os.path.normpath(p)
    for root in _PATHS:
        if p == root or p.startswith(root + "/"):
            return p
    return None


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event not in _EVENTS:
        return
    if event in ("open", "os.listdir", "os.scandir"):
        path = _linux_path(args[0]) if args else None
        if path is not None and not _from_psutil():
            _refuse(f"{'open' if event == 'open' else event}({path!r})")
    elif event == "ctypes.dlsym":
        name = args[1] if len(args) > 1 else None
        if isinstance(name, str) and name in _SYMBOLS:
            _refuse(f"ctypes lookup of {name}()")
    elif event == "ctypes.dlopen":
        name = args[0] if args else None
        if isinstance(name, (str, bytes)) and any(
                lib in os.fsdecode(name) for lib in _LIBRARIES):
            _refuse(f"ctypes load of {os.fsdecode(name)}")
    elif event == "import":
        if args and args[0] in _MODULES:
            _refuse(f"import {args[0]}")
    else:  # subprocess.Popen (executable, args, cwd, env), os.posix_spawn / os.exec (path, ...)
        exe = args[0] if args else None
        argv = args[1] if len(args) > 1 else None
        first = exe if exe is not None else (
            argv[0] if isinstance(argv, (list, tuple)) and argv else None)
        if isinstance(first, (str, bytes, os.PathLike)):
            tool = os.path.basename(os.fsdecode(first))
            if tool in _TOOLS:
                _refuse(f"running {tool}")
