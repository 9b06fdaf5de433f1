"""Linux confinement of the current process, in the order that makes it stick.

1. ``prctl(PR_SET_NO_NEW_PRIVS)``: no privilege gain through exec (setuid, file caps).
2. A fresh network namespace where the machine allows one: ``unshare(CLONE_NEWNET)`` as root,
   else ``CLONE_NEWUSER|CLONE_NEWNET`` (mapping our own uid/gid). Its loopback stays down and it
   has its own abstract-unix names. Failing this is NOT fatal: the seccomp filter alone already
   refuses every socket, so it is recorded as "unavailable" and confinement goes on.
3. Landlock (``_landlock``): reads only the system's and the given ``--read`` paths, writes
   only ``--write`` paths, opens only the basic device nodes and ``--dev`` ones; on ABI >= 6
   scoped abstract unix sockets and (``--signals scoped``) signals. A kernel without Landlock
   is recorded "unavailable" (the agent reports it and ``--sandbox required`` refuses); a
   kernel with it that refuses the ruleset is a setup failure.
4. Capabilities: bounding set emptied (``PR_CAPBSET_DROP``), securebits locked so uid 0 never
   regains any, ambient cleared, ``capset`` permitted/effective/inheritable to 0.
5. The seccomp filter of ``_policy`` (EPERM, never kill; clone3 ENOSYS), built with libseccomp
   and exported as its BPF program, which one ``seccomp(2)`` call loads. A forking parent
   (``prebuild``) exports each program once (``_bpf``); its children load their inherited copy.
6. Verification: ``/proc/self/status`` must show ``NoNewPrivs: 1``, ``Seccomp: 2`` and no
   capability; a side-effect-free self-test must see ``listen(-1)`` refused with EPERM (EBADF
   without the filter), ``socket(AF_INET)`` refused, and (Landlock) ``/`` not openable. Under a
   supervisor (``--notify-fd``) those two calls would each be a round trip to it (milliseconds
   under load, per launch), so the self-test asks the same program's rule that the kernel
   answers itself: ``pidfd_getfd(-1)`` refused with EPERM (EBADF without the filter). The
   network rules sit in that one program; if the supervisor fails, the kernel answers them
   ENOSYS: refused either way.

Only steps 1 and 3-6 may raise ``SetupError``; the launcher then exits 70 without exec'ing.
Must run single-threaded (user namespaces and Landlock require it; the launcher is).
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import os
import sys
import types

from . import _policy
from ._bpf import Program, export, load_program

TYPE_CHECKING = False  # not `typing`: the launcher imports this module on every start
if TYPE_CHECKING:
    from typing import Any

__all__ = ["SetupError", "confine", "prebuild"]

_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_AF_INET = 2
_SYS_PIDFD_GETFD = 438  # numbers from 424 on are the same on every architecture (Linux 5.1)
_SOCK_STREAM = 1
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
# NOROOT, NO_SETUID_FIXUP, KEEP_CAPS and NO_CAP_AMBIENT_RAISE, each with its lock bit.
_SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
_CAP_V3 = 0x20080522


class SetupError(RuntimeError):
    """Confinement could not be established; the child must not run."""


_libc_handle: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    """The C library, opened once (a forked child uses its parent's handle)."""
    global _libc_handle
    if _libc_handle is None:
        _libc_handle = ctypes.CDLL(None, use_errno=True)
        _libc_handle.syscall.restype = ctypes.c_long
    return _libc_handle


def _set_no_new_privs(libc: ctypes.CDLL, fault: str | None) -> None:
    if fault == "nnp":
        raise SetupError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: forced by {_policy.FAULT_ENV}=nnp")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _enter_netns(libc: ctypes.CDLL) -> str:
    """A fresh network namespace, or "unavailable" (with the reason kept out of the way)."""
    if libc.unshare(_CLONE_NEWNET) == 0:
        return _policy.ENFORCED
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
        # Map ourselves to ourselves so files and getuid() look the same inside.
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError:
            pass  # ids show as the overflow id inside; access checks still use the real ones
        return _policy.ENFORCED
    return _policy.UNAVAILABLE


# glibc's sonames. pyseccomp looks both libraries up with ctypes.util.find_library at import;
# importing ctypes.util (subprocess, tempfile, ...) and running `ldconfig -p` twice cost ~100 ms
# of every sandboxed start on this machine. When the standard sonames load, the launcher answers
# those two look-ups itself with a stand-in module; otherwise the real ctypes.util does.
_SONAMES = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}


def _find_library(name: str) -> str | None:
    soname = _SONAMES.get(name)
    if soname is not None:
        try:
            ctypes.CDLL(soname)
            return soname
        except OSError:
            pass
    sys.modules.pop("ctypes.util", None)  # drop the stand-in, use the real look-up
    real = importlib.import_module("ctypes.util")
    result: str | None = real.find_library(name)
    return result


def _import_pyseccomp():
    """Import the binding (the sandbox's one non-stdlib dependency; endpoints never import it)."""
    if "pyseccomp" in sys.modules or "ctypes.util" in sys.modules:
        import pyseccomp

        return pyseccomp
    stand_in = types.ModuleType("ctypes.util")
    stand_in.find_library = _find_library  # type: ignore[attr-defined]
    sys.modules["ctypes.util"] = stand_in
    ctypes.util = stand_in  # type: ignore[attr-defined]  # the import system sets it only on load
    try:
        import pyseccomp
    finally:
        if sys.modules.get("ctypes.util") is stand_in:
            del sys.modules["ctypes.util"]
        if getattr(ctypes, "util", None) is stand_in:
            delattr(ctypes, "util")
    return pyseccomp


_real_exe: dict[str, str] = {}


def _real_executable() -> str:
    """``sys.executable`` resolved, once per process and its forked children (a dozen lstat
    calls, ~0.1 ms: the interpreter a process runs does not move under it)."""
    exe = sys.executable
    if exe not in _real_exe:
        _real_exe[exe] = os.path.realpath(exe)
    return _real_exe[exe]


def _system_read(extra: tuple[str, ...]) -> list[str]:
    """What every sandboxed process reads: the system's folders, this Python installation
    (prefixes and every folder on the launcher's path: the SDK's and pyseccomp's) and the
    given paths."""
    paths = list(_policy.SYSTEM_READ)
    exe = _real_executable()
    # The launcher runs without site (-S): sys.prefix is then the base installation, and a
    # venv is the folder above its bin/python (sys.executable, unresolved).
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.dirname(exe)),
              os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))]
    paths += [p for p in sys.path if p.startswith("/")]
    paths += extra
    return list(dict.fromkeys(paths))


# The system part of ``_system_read`` by (interpreter, sys.path): a forking parent resolves it
# for its children's sys.path (``prebuild``), so a child only appends its own ``--read`` paths.
_read_cache: dict[tuple[str, ...], list[str]] = {}


def _read_paths(extra: tuple[str, ...]) -> list[str]:
    """``_system_read(extra)``, with the part that does not depend on ``extra`` resolved once
    per interpreter and ``sys.path``."""
    key = (sys.executable, *sys.path)
    system = _read_cache.get(key)
    if system is None:
        system = _read_cache[key] = _system_read(())
    return list(dict.fromkeys([*system, *extra])) if extra else list(system)


def _landlock(request: _policy.LaunchRequest) -> str:
    """Apply the Landlock ruleset; "enforced"/"unavailable" (no Landlock in this kernel). A
    non-root ``--gpu`` child may also write /proc (``_policy.GPU_PROC_WRITE``)."""
    from . import _landlock

    version = _landlock_abi()
    if version < 1:
        return _policy.UNAVAILABLE
    scope = _landlock.SCOPE_ABSTRACT_UNIX_SOCKET
    if request.signals == "scoped":
        scope |= _landlock.SCOPE_SIGNAL
    try:
        write = list(request.write)
        if request.gpu and os.geteuid() != 0:
            write.append(_policy.GPU_PROC_WRITE)
        _landlock.restrict(version, _read_paths(request.read), write,
                           [*_policy.SYSTEM_DEVICES, *request.devices], scope)
    except OSError as exc:
        raise SetupError(f"Landlock ruleset refused: {exc.strerror or exc}") from None
    return _policy.ENFORCED


_abi: list[int] = []


def _landlock_abi() -> int:
    """The kernel's Landlock ABI, asked once per process and its forked children."""
    if not _abi:
        from . import _landlock

        _abi.append(_landlock.abi())
    return _abi[0]


def last_capability() -> int:
    """The highest capability number this kernel knows (63 when it does not say)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


_last_cap: list[int] = []


def _last_capability() -> int:
    """``last_capability()``, read once per process and its forked children."""
    if not _last_cap:
        _last_cap.append(last_capability())
    return _last_cap[0]


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    """No capability survives into the child: bounding set, ambient, permitted, effective,
    inheritable. Without CAP_SETPCAP (a non-root agent) the bounding set cannot shrink; nothing
    can raise it either (no_new_privs), and the verification accepts it only for non-root."""
    for cap in range(_last_capability() + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: checked later
    libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0)  # same
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAP_V3, 0)
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable}: all zero
    if libc.capset(header, data) != 0:
        raise SetupError(f"capset() to no capabilities failed: {os.strerror(ctypes.get_errno())}")


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _build_filter(pyseccomp, notified: tuple[str, ...] = (), guard_pids: tuple[int, ...] = (),
                  gpu: bool = False):
    """``notified``: syscalls answered by a supervisor (``_notify``) instead of EPERM here.
    ``gpu``: the GPU driver's sockets are let through (``_policy.GPU_SOCKET_*``)."""
    filt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    # Cover the 32-bit ABIs a 64-bit kernel also accepts: otherwise an i386 binary inside the
    # sandbox would meet no rules (and the default for an unlisted arch is to kill it).
    if os.uname().machine == "x86_64":
        for arch in (pyseccomp.Arch.X86, pyseccomp.Arch.X32):
            if not filt.exist_arch(arch):
                filt.add_arch(arch)
    action = pyseccomp.ERRNO(_policy.REFUSAL_ERRNO)

    def add(act: int, name: str, *args) -> None:
        try:
            filt.add_rule(act, name, *args)
        except (OSError, ValueError, RuntimeError) as exc:
            if name in _policy.OPTIONAL_SYSCALLS and not args:
                return  # not on this architecture / libseccomp: nothing to refuse
            raise SetupError(f"seccomp rule for {name}() could not be added: {exc}") from None

    for name in _policy.REFUSED_SYSCALLS:
        act = pyseccomp.NOTIFY if name in notified else action
        if gpu and name in _policy.GPU_ALLOWED_SYSCALLS:
            continue
        if gpu and name == "socket":
            # Refused unless AF_UNIX and connection-oriented: each rule refuses one way out.
            add(act, name, pyseccomp.Arg(0, pyseccomp.NE, _policy.GPU_SOCKET_FAMILY))
            for kind in range(_policy.SOCK_TYPE_MASK + 1):
                if kind not in _policy.GPU_SOCKET_TYPES:
                    add(act, name, pyseccomp.Arg(1, pyseccomp.MASKED_EQ,
                                                 _policy.SOCK_TYPE_MASK, kind))
            continue
        add(act, name)
    for name in (*_policy.PROCESS_SYSCALLS, *_policy.PRIVILEGED_SYSCALLS):
        add(action, name)
    masked = pyseccomp.MASKED_EQ
    for flag in _policy.CLONE_NAMESPACE_FLAGS.values():
        add(action, "clone", pyseccomp.Arg(0, masked, flag, flag))
    add(pyseccomp.ERRNO(_policy.CLONE3_ERRNO), "clone3")
    # Signals at the guarded pids (the agent), their process groups, and kill(-1). Compared on
    # the low 32 bits: pid_t is an int, the register's upper half is not part of it.
    low = 0xFFFFFFFF
    kill_targets = {-1}
    for pid in guard_pids:
        kill_targets.add(pid)
        pgid = _pgid(pid)
        if pgid is not None and pgid > 1:
            kill_targets.add(-pgid)
    for target in sorted(kill_targets):
        add(action, "kill", pyseccomp.Arg(0, masked, low, target & low))
    for pid in guard_pids:
        for name in _policy.SIGNAL_SYSCALLS_BY_PID[1:]:
            add(action, name, pyseccomp.Arg(0, masked, low, pid & low))
    return filt


# Programs a forking parent exported ahead (``prebuild``), by (notified syscalls, guarded pids,
# gpu): a filter depends on nothing else, and building one (~1.7 ms of libseccomp calls) and
# generating its BPF (~1 ms) is then done once, not in every child.
_programs: dict[tuple[tuple[str, ...], tuple[int, ...], bool], Program] = {}


def prebuild(guard_pids: tuple[int, ...], sys_paths: tuple[tuple[str, ...], ...] = ()) -> None:
    """Export both programs a launch guarding ``guard_pids`` may load (with and without
    notification) in this process, for the children it forks; also resolve once what the
    other walls look up on every launch, and the read list of a child confining itself with
    each of ``sys_paths`` as its ``sys.path``. No binding here: nothing is built, each launch
    fails as it would have."""
    _libc()
    _real_executable()
    saved = sys.path
    try:
        for path in sys_paths:
            sys.path = list(path)
            _read_paths(())
    finally:
        sys.path = saved
    _landlock_abi()
    _last_capability()
    try:
        pyseccomp = _import_pyseccomp()
        from ._notify import NOTIFIED_SYSCALLS
    except (ImportError, OSError):
        return
    for notified in ((), tuple(NOTIFIED_SYSCALLS)):
        key = (notified, tuple(guard_pids), False)
        if key not in _programs:
            try:
                program = export(pyseccomp, _build_filter(pyseccomp, *key), bool(notified))
            except Exception:  # noqa: BLE001  (an error is the launch's to report, when it builds)
                continue
            if program is not None:
                _programs[key] = program


def _load_filter(fault: str | None, notify_fd: int | None = None,
                 guard_pids: tuple[int, ...] = (), gpu: bool = False) -> None:
    if fault == "seccomp":
        raise SetupError(f"seccomp filter not loaded: forced by {_policy.FAULT_ENV}=seccomp")
    notified: tuple[str, ...] = ()
    if notify_fd is not None:  # imported only then: it costs every other launch nothing
        from ._notify import NOTIFIED_SYSCALLS as notified
    key = (tuple(notified), tuple(guard_pids), gpu)
    program = _programs.get(key)
    filt: Any = None
    pyseccomp: Any = None
    if program is None:  # not exported ahead (a launcher of its own): built and exported here
        try:
            pyseccomp = _import_pyseccomp()
        except (ImportError, OSError) as exc:
            raise SetupError(f"seccomp binding unavailable: {exc}") from None
        filt = _build_filter(pyseccomp, *key)
        program = export(pyseccomp, filt, bool(notified))
    if fault == "verify":
        return  # pretend the load went fine: verification below must notice
    listener = -1
    try:
        if program is not None:
            listener = load_program(_libc(), program)
        else:
            filt.load()
    except OSError as exc:
        raise SetupError(f"seccomp filter load failed: {exc}") from None
    if notify_fd is not None:  # the supervisor answers from here on (the self-test included)
        from ._notify import hand_over, listener_fd

        try:
            hand_over(notify_fd, listener if program is not None
                      else listener_fd(pyseccomp, filt))
        except OSError as exc:
            raise SetupError(f"cannot hand the seccomp listener to the supervisor "
                             f"(--notify-fd {notify_fd}): {exc}") from None


def _verify(libc: ctypes.CDLL, landlock: str = _policy.UNAVAILABLE,
            granted: tuple[str, ...] = (), gpu_sockets: bool = False,
            watched: bool = False) -> None:
    try:
        with open("/proc/self/status") as f:
            status = _policy.parse_proc_status(f.read())
    except OSError as exc:
        raise SetupError(f"cannot read /proc/self/status to verify: {exc}") from None
    problem = _policy.confinement_problem(status)
    if problem:
        raise SetupError(problem)
    for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        if int(status.get(cap, "1"), 16) != 0:
            raise SetupError(f"{cap} is {status.get(cap)!r} in /proc/self/status, expected 0")
    if status.get("Uid", "").split()[:1] == ["0"] and int(status.get("CapBnd", "1"), 16) != 0:
        raise SetupError(f"CapBnd is {status.get('CapBnd')!r} for uid 0, expected 0")
    if landlock == _policy.ENFORCED and "/" not in granted:
        try:
            os.close(os.open("/", os.O_RDONLY | os.O_DIRECTORY))
        except PermissionError:
            pass
        else:
            raise SetupError("self-test: Landlock lets / be opened")
    # The mode says "a filter"; these say "our filter". listen/connect on fd -1 are EBADF
    # unfiltered (a GPU child may listen: its driver does). Watched, the network calls go to
    # the supervisor: a rule the kernel answers itself says the same (module docstring, 6).
    if watched:
        if libc.syscall(_SYS_PIDFD_GETFD, -1, -1, 0) != -1 \
                or ctypes.get_errno() != _policy.REFUSAL_ERRNO:
            raise SetupError("self-test: pidfd_getfd() is not refused by the filter")
        return
    if gpu_sockets:
        name, answer = "connect", libc.connect(-1, None, 0)
    else:
        name, answer = "listen", libc.listen(-1, 0)
    if answer == 0 or ctypes.get_errno() != _policy.REFUSAL_ERRNO:
        raise SetupError(f"self-test: {name}() is not refused by the filter")
    fd = libc.socket(_AF_INET, _SOCK_STREAM, 0)
    if fd >= 0:
        os.close(fd)
        raise SetupError("self-test: socket(AF_INET) is not refused by the filter")
    if ctypes.get_errno() != _policy.REFUSAL_ERRNO:
        raise SetupError(f"self-test: socket(AF_INET) failed with {errno.errorcode.get(ctypes.get_errno())}")


def confine(net: str, fault: str | None, notify_fd: int | None = None,
            request: _policy.LaunchRequest | None = None) -> dict[str, str]:
    """Confine this process (and everything it execs). Returns what each step achieved.
    ``request``: the paths, signal mode and guarded pids (None: nothing but the system's)."""
    if request is None:
        request = _policy.LaunchRequest(net, ("true",))
    if net not in _policy.NET_MODES:
        raise SetupError(f"unsupported net mode {net!r}")
    if fault is not None and fault not in _policy.FAULTS:
        raise SetupError(
            f"unknown {_policy.FAULT_ENV}={fault!r} (test hook values: {', '.join(_policy.FAULTS)})"
        )
    libc = _libc()
    _set_no_new_privs(libc, fault)
    netns = _enter_netns(libc)  # best effort, see the module docstring
    landlock = _landlock(request)
    _drop_capabilities(libc)
    # The GPU driver's abstract socket is let through only where it stays private: its own
    # network namespace, or Landlock's abstract-socket scope (ABI 6).
    gpu_sockets = request.gpu and (netns == _policy.ENFORCED or (
        landlock == _policy.ENFORCED and _landlock_abi() >= 6))
    _load_filter(fault, notify_fd, request.guard_pids, gpu_sockets)
    _verify(libc, landlock, request.read + request.write, gpu_sockets,
            watched=notify_fd is not None)
    if notify_fd is not None:
        from ._notify import verified

        verified(notify_fd)  # later attempts of this pid are the child's
    return {"no_new_privs": _policy.ENFORCED, "seccomp": _policy.ENFORCED, "netns": netns,
            "landlock": landlock}
