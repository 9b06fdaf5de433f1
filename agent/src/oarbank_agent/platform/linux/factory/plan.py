"""What the factory does with one argv: pure decisions, no I/O.

Two questions, answered from the argv alone:

- ``split_launch``: is the argv the sandbox launcher's (``procs.launch_argv`` put it there)?
  Then the factory confines the child itself, with the launcher's own parsed request and code
  (``oarbank_sdk.sandbox.launch.confine_or_refuse``), and goes on with the command after ``--``: the
  same walls, without a second interpreter start.
- ``in_place``: is the command ``python -I script.py ...`` with the factory's own interpreter,
  and a locale that gives the same start-up as the factory's? Then the script can run in the
  forked child (``runpy``) instead of an ``execve`` of a fresh interpreter. Anything else (any
  other option, ``-c``, ``-m``, another interpreter, another locale) is exec'd: the in-place
  run must be exact or not happen.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from oarbank_sdk import sandbox

__all__ = ["LaunchPlan", "split_launch", "in_place", "inherited_ignores", "LOCALE_VARS"]

# What decides a Python start-up's locale (utf8_mode, stdio encodings and the LC_CTYPE the
# interpreter adds to its environment: PEP 538/540). With -I every PYTHON* variable is ignored.
LOCALE_VARS = ("LC_ALL", "LC_CTYPE", "LANG")
_LAUNCH_MODULE = ("-I", "-m", "oarbank_sdk.sandbox.launch")


@dataclass(frozen=True)
class LaunchPlan:
    """The launcher's part of an argv, parsed. ``request`` is None: no launcher (run as is).
    ``boot_dirs``: the two folders the launcher's ``-S -c`` boot puts on its ``sys.path``
    (what its Landlock read grants are computed from); None for the ``-m`` form."""

    command: tuple[str, ...]
    request: sandbox.LaunchRequest | None = None
    fault: str | None = None
    boot_dirs: tuple[str, str] | None = None


def split_launch(argv: Sequence[str], python: str, boot: str) -> LaunchPlan:
    """``[env FAULT=v] <python> -I (-m launcher | -S -c <boot> d1 d2) OPTIONS -- CMD...``
    -> the parsed launch; any other argv -> run as is. ``boot``: the launcher's ``-c`` code.
    Raises ``sandbox.UsageError`` for a launcher argv whose options do not parse (the launcher
    would exit 70 on them)."""
    args = list(argv)
    fault = None
    if (len(args) > 2 and args[0].rsplit("/", 1)[-1] == "env"
            and args[1].startswith(sandbox.FAULT_ENV + "=")):
        fault = args[1].partition("=")[2] or None
        args = args[2:]
    if not args or args[0] != python:
        return LaunchPlan(tuple(argv))
    rest = args[1:]
    dirs: tuple[str, str] | None = None
    if tuple(rest[:3]) == _LAUNCH_MODULE:
        opts = rest[3:]
    elif rest[:4] == ["-I", "-S", "-c", boot] and len(rest) >= 6:
        dirs = (rest[4], rest[5])
        opts = rest[6:]
    else:
        return LaunchPlan(tuple(argv))
    request = sandbox.parse_launch_args(opts)
    return LaunchPlan(tuple(request.argv), request, fault, dirs)


def in_place(command: Sequence[str], python: str, env: Mapping[str, str],
             factory_locale: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """(script, sys.argv) when ``command`` may run in the factory's child; else None.

    Only ``<python> -I SCRIPT [ARGS...]``: the factory itself runs with exactly ``-I``, so
    ``sys.flags`` and ``sys.path`` are those ``python -I`` gives. ``factory_locale``: the
    factory's own ``LOCALE_VARS`` (the environment it was started with)."""
    if len(command) < 3 or command[0] != python or command[1] != "-I":
        return None
    script = command[2]
    if not script or script.startswith("-"):
        return None  # another option (or "-": stdin): python would read it differently
    if any(env.get(k) != factory_locale.get(k) for k in LOCALE_VARS):
        return None
    return script, [script, *command[3:]]


# Signals whose disposition an exec'd child inherits from us, as numbers (checked per spawn:
# the enum work of building this each time cost 115 us a spawn, the check alone 30 us).
# SIGPIPE/SIGXFSZ are left out: Python ignores them itself, and Popen restores them.
_INHERITABLE = tuple(int(s) for s in signal.valid_signals()
                     if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE,
                                  getattr(signal, "SIGXFSZ", signal.SIGPIPE)))


def inherited_ignores() -> list[int]:
    """The signals this process ignores that an exec'd child keeps ignored, as the direct
    path's children get them: asked by the agent at each spawn, because its dispositions change
    after the factory starts (under ``nohup`` SIGHUP is ignored until the agent's reload handler
    is set)."""
    return [s for s in _INHERITABLE if signal.getsignal(s) == signal.SIG_IGN]
