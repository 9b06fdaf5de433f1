"""The sandbox every runner, service op and service daemon runs in (and all they start).

Public API::

    wrap(argv, *, net="none") -> list[str]      # launcher prefix + argv, to hand to Popen
    capabilities() -> dict[str, str]            # each CAPABILITY_NAMES entry: "enforced"/"unavailable"
    available() -> bool                         # the launcher can confine a child here
    EXIT_SETUP_FAILED = 70, EXIT_EXEC_FAILED = 71

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
    NET_MODES,
    UNAVAILABLE,
    derive_capabilities,
)

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
]

_PROBE_TIMEOUT_S = 30.0
_lock = _thread.allocate_lock()
_cached: dict[str, str] | None = None


# The launcher runs with -S (no site: it is the bulk of an interpreter start, ~100 ms on a
# loaded machine) and gets the two folders it imports from as its first two arguments.
_BOOT = (
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


def launcher_argv(*, net: str = "none", python: str | None = None) -> list[str]:
    """The launcher's command prefix (everything before the child's argv)."""
    if net not in NET_MODES:
        raise ValueError(f"unsupported net mode {net!r} (supported: {', '.join(NET_MODES)})")
    exe = python or sys.executable
    dirs = _import_dirs()
    if dirs is None:
        return [exe, "-I", "-m", "oarbank_sdk.sandbox.launch", "--net", net, "--"]
    return [exe, "-I", "-S", "-c", _BOOT, *dirs, "--net", net, "--"]


def wrap(argv: list[str], *, net: str = "none") -> list[str]:
    """``argv`` run inside the sandbox: pass the result to ``subprocess.Popen`` as is.

    The launcher execs ``argv`` in place, so the pid, process group, inherited descriptors
    (``pass_fds``), environment and working folder are those the caller gives the Popen.
    """
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("wrap() needs a non-empty list of strings")
    return [*launcher_argv(net=net), *argv]


def _netns_of_self() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def _probe() -> dict[str, str]:
    # Imported here: the launcher imports this package and should start as fast as it can.
    import json
    import subprocess

    # Same environment as every real launch (including a FAULT_ENV someone left set): the
    # report must say what launches here actually get.
    argv = wrap([sys.executable, "-I", "-m", "oarbank_sdk.sandbox._probe", _netns_of_self()])
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
