"""Linux confinement of the current process, in the order that makes it stick.

1. ``prctl(PR_SET_NO_NEW_PRIVS)``: no privilege gain through exec (setuid, file caps).
2. A fresh network namespace where the machine allows one: ``unshare(CLONE_NEWNET)`` as root,
   else ``CLONE_NEWUSER|CLONE_NEWNET`` (mapping our own uid/gid). Its loopback stays down and it
   has its own abstract-unix names. Failing this is NOT fatal: the seccomp filter alone already
   refuses every socket, so it is recorded as "unavailable" and confinement goes on.
3. The seccomp filter of ``_policy.REFUSED_SYSCALLS`` (EPERM, never kill), via libseccomp.
4. Verification: ``/proc/self/status`` must show ``NoNewPrivs: 1`` and ``Seccomp: 2``, and a
   side-effect-free self-test must see ``listen(-1)`` refused with EPERM (EBADF without the
   filter) and ``socket(AF_INET)`` refused.

Only steps 1, 3 and 4 may raise ``SetupError``; the launcher then exits 70 without exec'ing.
Must run single-threaded (user namespaces require it; the launcher is).
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import os
import sys
import types

from . import _policy

__all__ = ["SetupError", "confine"]

_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_AF_INET = 2
_SOCK_STREAM = 1


class SetupError(RuntimeError):
    """Confinement could not be established; the child must not run."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


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


def _build_filter(pyseccomp):
    filt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    # Cover the 32-bit ABIs a 64-bit kernel also accepts: otherwise an i386 binary inside the
    # sandbox would meet no rules (and the default for an unlisted arch is to kill it).
    if os.uname().machine == "x86_64":
        for arch in (pyseccomp.Arch.X86, pyseccomp.Arch.X32):
            if not filt.exist_arch(arch):
                filt.add_arch(arch)
    action = pyseccomp.ERRNO(_policy.REFUSAL_ERRNO)
    for name in _policy.REFUSED_SYSCALLS:
        try:
            filt.add_rule(action, name)
        except (OSError, ValueError, RuntimeError) as exc:
            raise SetupError(f"seccomp rule for {name}() could not be added: {exc}") from None
    return filt


def _load_filter(fault: str | None) -> None:
    if fault == "seccomp":
        raise SetupError(f"seccomp filter not loaded: forced by {_policy.FAULT_ENV}=seccomp")
    try:
        pyseccomp = _import_pyseccomp()
    except (ImportError, OSError) as exc:
        raise SetupError(f"seccomp binding unavailable: {exc}") from None
    filt = _build_filter(pyseccomp)
    if fault == "verify":
        return  # pretend the load went fine: verification below must notice
    try:
        filt.load()
    except OSError as exc:
        raise SetupError(f"seccomp filter load failed: {exc}") from None


def _verify(libc: ctypes.CDLL) -> None:
    try:
        with open("/proc/self/status") as f:
            status = _policy.parse_proc_status(f.read())
    except OSError as exc:
        raise SetupError(f"cannot read /proc/self/status to verify: {exc}") from None
    problem = _policy.confinement_problem(status)
    if problem:
        raise SetupError(problem)
    # The mode says "a filter"; these say "our filter". listen on fd -1 is EBADF unfiltered.
    if libc.listen(-1, 0) == 0 or ctypes.get_errno() != _policy.REFUSAL_ERRNO:
        raise SetupError("self-test: listen() is not refused by the filter")
    fd = libc.socket(_AF_INET, _SOCK_STREAM, 0)
    if fd >= 0:
        os.close(fd)
        raise SetupError("self-test: socket(AF_INET) is not refused by the filter")
    if ctypes.get_errno() != _policy.REFUSAL_ERRNO:
        raise SetupError(f"self-test: socket(AF_INET) failed with {errno.errorcode.get(ctypes.get_errno())}")


def confine(net: str, fault: str | None) -> dict[str, str]:
    """Confine this process (and everything it execs). Returns what each step achieved."""
    if net not in _policy.NET_MODES:
        raise SetupError(f"unsupported net mode {net!r}")
    if fault is not None and fault not in _policy.FAULTS:
        raise SetupError(
            f"unknown {_policy.FAULT_ENV}={fault!r} (test hook values: {', '.join(_policy.FAULTS)})"
        )
    libc = _libc()
    _set_no_new_privs(libc, fault)
    netns = _enter_netns(libc)  # best effort, see the module docstring
    _load_filter(fault)
    _verify(libc)
    return {"no_new_privs": _policy.ENFORCED, "seccomp": _policy.ENFORCED, "netns": netns}
