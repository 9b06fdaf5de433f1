"""Which platform backend a process runs, decided once from the system (pure).

``OARBANK_PLATFORM=darwin`` on Linux selects the macOS backend as a test profile: the POSIX
path as macOS runs it, with every Linux-only call made to fail. Nothing else can be forced: a
Linux backend on macOS or a POSIX one on Windows would only fail later and less clearly.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["choose", "BackendUnavailable", "ENV"]

ENV = "OARBANK_PLATFORM"


class BackendUnavailable(RuntimeError):
    """This system has no backend the agent can run on (the message says what is missing)."""


def choose(sys_platform: str, env: Mapping[str, str]) -> str:
    """``linux``, ``darwin`` or ``windows`` for ``sys.platform`` and the environment.

    Raises ``BackendUnavailable`` for an ``OARBANK_PLATFORM`` this system cannot honour.
    """
    native = ("linux" if sys_platform.startswith("linux") else
              "darwin" if sys_platform == "darwin" else
              "windows" if sys_platform == "win32" else sys_platform)
    forced = env.get(ENV, "")
    if "-" in forced:
        # The contract's OARBANK_PLATFORM=<os>-<arch> in a job's environment (section 4): the
        # node's platform told to a runner, not a choice (an `oarbank-agent submit` from a
        # runner must work).
        forced = ""
    if not forced or forced == native:
        return native
    if forced == "darwin" and native == "linux":
        return "darwin"
    raise BackendUnavailable(
        f"{ENV}={forced!r} cannot be honoured on {sys_platform}: only 'darwin' on Linux "
        "(the macOS profile, for tests) may be chosen; unset it to use this system's backend")
