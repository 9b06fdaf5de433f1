"""The sandbox launcher: ``python -I -m oarbank_sdk.sandbox.launch [OPTIONS] -- ARGV...``.

OPTIONS: ``--net none``; ``--read PATH`` / ``--write PATH`` / ``--dev PATH`` (repeatable,
absolute: Landlock grants; nothing else but the system's folders is readable, nothing else
writable); ``--signals scoped|open`` (default scoped: no signal outside this sandbox);
``--guard-pid PID`` (repeatable: no signal to PID or its process group, whatever the scope).

Confines itself, verifies the confinement, then execs ARGV (same pid; the filter and
no_new_privs are inherited by ARGV and every process it starts). It never runs ARGV
unconfined:

- exit 70 (``EXIT_SETUP_FAILED``): bad arguments, or confinement could not be set up or
  verified; ARGV never ran. One line on stderr says why.
- exit 71 (``EXIT_EXEC_FAILED``): confined, but ARGV could not be exec'd (not found, not
  executable). One line on stderr says why.
- anything else is ARGV's own exit status.

Linux: see ``_linux``. macOS: execs ``sandbox-exec -p PROFILE ARGV...`` with the profile of
``_seatbelt`` for the same ``--read``/``--write``/``--dev`` grants (``--signals``, ``--guard-pid``
and ``--gpu`` have no Seatbelt counterpart: signals stay inside the sandbox). Other platforms:
exit 70.

Test hook: ``OARBANK_SANDBOX_FAULT`` (see ``_policy.FAULT_ENV``) forces a setup failure.
"""

from __future__ import annotations

import os
import sys

from . import _policy

__all__ = ["main", "refuse", "confine_or_refuse", "received_environ", "seatbelt_read",
           "seatbelt_argv"]


def refuse(code: int, message: str) -> int:
    """Say why on stderr as the launcher does and return ``code`` (the exit status to use)."""
    # One line, whatever the message holds, so the agent can show it as a reason.
    sys.stderr.write(f"{_policy.LAUNCHER_PREFIX}{' '.join(message.split())}\n")
    sys.stderr.flush()
    return code


def confine_or_refuse(request: _policy.LaunchRequest, fault: str | None) -> int | None:
    """Confine this process (Linux) as ``request`` says. None: confined; else the exit status
    (70) after the one-line refusal: ``request.argv`` must not run. The agent's process factory
    confines its forked children with this too, so both paths refuse alike."""
    from ._linux import SetupError, confine

    argv0 = request.argv[0]
    try:
        confine(request.net, fault, request.notify_fd, request)
    except SetupError as exc:
        return refuse(_policy.EXIT_SETUP_FAILED,
                      f"setup failed: {exc}; refusing to run {argv0!r} unconfined")
    except Exception as exc:  # a bug or a broken binding is a setup failure too: fail closed
        return refuse(_policy.EXIT_SETUP_FAILED,
                      f"setup failed: unexpected {type(exc).__name__}: {exc}; "
                      f"refusing to run {argv0!r} unconfined")
    return None


def seatbelt_read(request: _policy.LaunchRequest) -> list[str]:
    """What a macOS child reads besides the system's folders: this Python installation (its
    prefixes and every folder on the launcher's path, as ``_linux`` grants) and ``--read``."""
    exe = os.path.abspath(sys.executable)
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.dirname(exe)),
             os.path.dirname(os.path.dirname(os.path.realpath(exe)))]
    paths += [p for p in sys.path if p.startswith("/")]
    return list(dict.fromkeys([*paths, *request.read]))


def seatbelt_argv(request: _policy.LaunchRequest) -> list[str]:
    """``sandbox-exec -p PROFILE ARGV...`` for ``request``: the Linux launcher's grants (resolved:
    Seatbelt matches real paths, and /tmp is /private/tmp on macOS)."""
    from . import _seatbelt

    return _seatbelt.command(list(request.argv),
                             writable=[os.path.realpath(p) for p in request.write],
                             readable=[os.path.realpath(p) for p in seatbelt_read(request)],
                             devices=request.devices)


def received_environ() -> dict[str, str]:
    """The environment exactly as the launcher was given it, for the child.

    Not ``os.environ``: the interpreter adds to it at startup (PEP 538 locale coercion sets
    ``LC_CTYPE`` when the locale is C, even with ``-I``), and the child's environment must be
    the caller's (the agent's op/runner environment is exact). ``/proc/self/environ`` is the
    block this process was exec'd with; elsewhere ``os.environ`` is all there is.
    """
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return dict(os.environ)
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def main(args: list[str] | None = None) -> int:
    try:
        request = _policy.parse_launch_args(sys.argv[1:] if args is None else args)
    except _policy.UsageError as exc:
        return refuse(_policy.EXIT_SETUP_FAILED, f"setup failed: {exc}")
    argv = list(request.argv)
    fault = os.environ.get(_policy.FAULT_ENV) or None

    if sys.platform.startswith("linux"):
        code = confine_or_refuse(request, fault)
        if code is not None:
            return code
    elif sys.platform == "darwin":
        from . import _seatbelt

        if fault is not None or not os.access(_seatbelt.SANDBOX_EXEC, os.X_OK):
            why = f"forced by {_policy.FAULT_ENV}" if fault else f"{_seatbelt.SANDBOX_EXEC} not found"
            return refuse(
                _policy.EXIT_SETUP_FAILED, f"setup failed: {why}; refusing to run {argv[0]!r} unconfined"
            )
        argv = seatbelt_argv(request)  # sandbox-exec refuses ARGV if the profile does not compile
    else:
        return refuse(
            _policy.EXIT_SETUP_FAILED,
            f"setup failed: no sandbox on platform {sys.platform}; refusing to run {argv[0]!r} unconfined",
        )

    sys.stdout.flush()
    try:
        os.execvpe(argv[0], argv, received_environ())
    except OSError as exc:
        return refuse(_policy.EXIT_EXEC_FAILED, f"exec failed: {argv[0]!r}: {exc.strerror or exc}")
    return _policy.EXIT_EXEC_FAILED  # not reached: execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main())
