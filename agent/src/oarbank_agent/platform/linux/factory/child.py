"""The forked child: from a copy of the factory to the command, in the order that makes it exact.

The order is what ``procs.spawn``'s direct path gives a child (the entry shell joining its group,
``Popen``'s session, descriptors, working folder, the sandbox launcher, ``execve``), so a
command cannot tell the two paths apart (``tests/test_factory.py``):

1. signal handling back to a fresh process's (the factory's SIGCHLD wakeup is dropped),
2. its group's ``join`` file (before any code of the command runs), then a new session,
3. descriptors: stdin ``/dev/null``, stdout, stderr and the inherited ones at the numbers the
   agent gave (its environment names them), nothing else,
4. working folder, umask, resource limits, the exact environment,
5. the sandbox with the launcher's own request and code (``plan.split_launch``),
6. ``execve``, or, for ``python -I script.py`` (``plan.in_place``), ``runpy`` in this process
   with ``sys.argv``, ``sys.path``, ``os.environ`` and stdio as that start-up would set them,
   and no module of the factory's that a fresh start would import otherwise (``heldmodules``;
   a script whose folder would shadow a standard-library module the factory holds is exec'd).

Failures before the point where the direct path would have exec'd (the launcher, or the
command when unsandboxed) go back to the factory through ``err_fd`` and ``spawn`` raises
``OSError`` there, as ``Popen`` does. The sandbox's own refusals are the launcher's: one line
on stderr, exit 70 (setup) or 71 (exec).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import io
import json
import os
import resource
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, ClassVar, NoReturn

from oarbank_agent.platform.linux.factory import heldmodules, plan, scriptcache
from oarbank_sdk import sandbox
from oarbank_sdk.sandbox import launch as launcher

__all__ = ["Startup", "run"]

_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3
_STDIO = ((0, "<stdin>", "r"), (1, "<stdout>", "w"), (2, "<stderr>", "w"))
_SETTABLE = tuple(sig for sig in signal.valid_signals()
                  if sig not in (signal.SIGKILL, signal.SIGSTOP))


@dataclass
class Startup:
    """What the factory saw of its own start-up, before it changed anything: what a fresh
    ``python -I`` started the same way would see too."""

    python: str
    sys_path: list[str]
    locale: dict[str, str]  # plan.LOCALE_VARS as the factory received them
    env_added: dict[str, str]  # what the interpreter added to its environment (PEP 538)
    launcher_sys_path: list[str]  # sys.path of the launcher's -I -S start-up, minus its dirs
    boot: str  # the launcher's -c code (plan.split_launch)
    stdio: list[tuple[str, str]] = field(default_factory=list)  # (encoding, errors) per fd
    # What a fresh ``python -I script.py`` has in sys.modules when the script starts (measured
    # by the factory), and the import machinery as the factory's own start-up left it.
    fresh_modules: frozenset[str] = frozenset()
    meta_path: list[Any] = field(default_factory=list)
    path_hooks: list[Any] = field(default_factory=list)
    # The factory's modules that a fresh start lacks, as the factory last took them
    # (heldmodules.py; a child takes them again only if it imported something since).
    held: heldmodules.Held | None = None

    def held_now(self) -> heldmodules.Held:
        self.held = heldmodules.snapshot(self.fresh_modules, self.held)
        return self.held


def capture(boot: str, launcher_sys_path: list[str]) -> Startup:
    received = launcher.received_environ()  # as the launcher reads it: the same start-up
    added = {k: v for k, v in os.environ.items() if k not in received}
    stdio = [(s.encoding, s.errors or "strict") for s in (sys.__stdin__, sys.__stdout__,
                                                         sys.__stderr__) if s is not None]
    return Startup(sys.executable, list(sys.path),
                   {k: received[k] for k in plan.LOCALE_VARS if k in received},
                   added, launcher_sys_path, boot, stdio, meta_path=list(sys.meta_path),
                   path_hooks=list(sys.path_hooks))


class _Refused(Exception):
    """A failure the direct path would show as OSError from Popen. ``filename``: what Popen's
    error names (the command, or the working folder), so both read the same."""

    def __init__(self, exc: OSError, what: str, filename: str | None = None) -> None:
        super().__init__(f"{what}: {exc.strerror or exc}")
        self.errno = exc.errno or 0
        self.filename = filename


def _report(err_fd: int, exc: _Refused) -> NoReturn:
    with contextlib.suppress(OSError):
        os.write(err_fd, json.dumps({"errno": exc.errno, "error": str(exc),
                                     "filename": exc.filename}).encode())
    os._exit(127)


def _place_fds(received: list[int], targets: list[int], err_fd: int) -> int:
    """Descriptors at their numbers, stdin /dev/null, every other one closed. Returns where
    ``err_fd`` is now (it stays close-on-exec)."""
    floor = max([2, err_fd, *received, *targets]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in received]
    err_fd = fcntl.fcntl(err_fd, fcntl.F_DUPFD_CLOEXEC, floor)
    for src, target in zip(moved, targets, strict=True):
        os.dup2(src, target, inheritable=True)
    null = os.open(os.devnull, os.O_RDWR)
    if null != 0:
        os.dup2(null, 0, inheritable=True)
    keep = sorted({0, 1, 2, *targets, err_fd})
    if null not in keep:
        os.close(null)
    low = 0
    for fd in keep:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 30)
    return err_fd


def _set_signals(ignored: frozenset[int], also_ignored: tuple[int, ...], python: bool) -> None:
    """Every disposition as a fresh exec leaves it (ignored ones stay ignored); ``python``:
    then as a fresh interpreter sets them (SIGPIPE/SIGXFSZ ignored, SIGINT -> KeyboardInterrupt)."""
    signal.set_wakeup_fd(-1)
    ign = set(ignored) | set(also_ignored)
    if python:
        ign |= {signal.SIGPIPE, getattr(signal, "SIGXFSZ", signal.SIGPIPE)}
    for sig in _SETTABLE:
        want: Any = signal.SIG_IGN if sig in ign else signal.SIG_DFL
        if python and sig == signal.SIGINT and want == signal.SIG_DFL:
            want = signal.default_int_handler
        # Only what differs (a sigaction each, and this runs up to three times a child: 0.7 ms
        # for all 62). getsignal is the interpreter's record of the disposition it set or found
        # at its start; None (a handler set from C) is set all the same.
        if signal.getsignal(sig) != want:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, want)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _set_limits(rlimits: list[list[int]]) -> None:
    for res, soft, hard in rlimits:
        with contextlib.suppress(OSError, ValueError):
            if resource.getrlimit(res) != (soft, hard):
                resource.setrlimit(res, (soft, hard))


def _new_stdio(startup: Startup) -> None:
    """sys.stdin/out/err over fds 0-2 as CPython's create_stdio makes them."""
    streams = []
    for (fd, name, mode), (enc, errors) in zip(_STDIO, startup.stdio, strict=True):
        buf: Any = open(fd, mode + "b", -1, closefd=False)  # noqa: SIM115 (sys owns it)
        raw = buf.raw
        raw.name = name
        line = raw.isatty() or fd == 2
        text = io.TextIOWrapper(buf, enc, errors, "\n", line, False)
        text.mode = mode  # type: ignore[misc]
        streams.append(text)
    for name, stream in zip(("stdin", "stdout", "stderr"), streams, strict=True):
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _confine(startup: Startup, launch: plan.LaunchPlan) -> None:
    """The launcher's confinement, with the launcher's own code, from its point of view
    (its sys.path decides the Python folders Landlock lets it read)."""
    assert launch.request is not None
    saved = sys.path
    if launch.boot_dirs is not None:
        sys.path = [launch.boot_dirs[0], *startup.launcher_sys_path, launch.boot_dirs[1]]
    try:
        code = launcher.confine_or_refuse(launch.request, launch.fault)
    finally:
        sys.path = saved
    if code is not None:
        os._exit(code)


def run(req: dict[str, Any], received: list[int], startup: Startup, err_fd: int,
        offered: scriptcache.Compiled | None = None) -> NoReturn:
    """Never returns: execs, runs the script and exits, or exits with the failure.
    ``offered``: the factory's compiled copy of the script it expects this child to run in
    place (used only if the child's own look at the file gives the same stamp)."""
    err = [err_fd]  # where it is now: _place_fds moves it out of the children's way
    try:
        _run(req, received, startup, err, offered)
    except _Refused as exc:
        _report(err[0], exc)
    except BaseException as exc:  # a bug here must never return into the factory's loop
        with contextlib.suppress(BaseException):
            os.write(err[0], json.dumps({"errno": 0, "error": f"process factory: "
                                         f"{type(exc).__name__}: {exc}"}).encode())
    os._exit(127)


def _run(req: dict[str, Any], received: list[int], startup: Startup, err: list[int],
         offered: scriptcache.Compiled | None) -> None:
    err_fd = err[0]
    argv: list[str] = req["argv"]
    env: dict[str, str] = req["env"]
    # The agent's ignored signals at this spawn (plan.inherited_ignores): what a direct
    # child would inherit. Asked per spawn: they change after the factory starts.
    ignored = frozenset(int(s) for s in req["ignored"])
    _set_signals(ignored, (), python=False)  # the factory's own handlers go first
    join = req.get("join")  # the backend's (Slot.factory_kwargs): where this pid is written
    if join:
        try:
            with open(join, "w") as f:
                f.write(str(os.getpid()))
        except OSError as exc:
            raise _Refused(exc, f"cannot join its group ({join})") from None
    os.setsid()
    try:
        err_fd = err[0] = _place_fds(received, list(req["fds"]), err_fd)
    except OSError as exc:
        raise _Refused(exc, "cannot place the child's descriptors") from None
    try:
        os.chdir(req["cwd"])
    except OSError as exc:
        raise _Refused(exc, f"cannot enter {req['cwd']}", req["cwd"]) from None
    os.umask(int(req["umask"]))
    _set_limits(req.get("rlimits") or [])
    try:
        launch = plan.split_launch(argv, startup.python, startup.boot)
    except sandbox.UsageError as exc:
        launch = None
        usage = str(exc)
    _new_stdio(startup)
    if launch is None:
        os.close(err_fd)
        os._exit(_fail_launch(f"setup failed: {usage}"))
    sandboxed = launch.request is not None
    if sandboxed:
        # The direct path has exec'd the launcher by now: what fails from here is the
        # launcher's to say (exit 70/71), and the factory need not wait for it.
        os.close(err_fd)
        _set_signals(ignored, (), python=True)  # the launcher is a Python process
    command = list(launch.command)
    if sandboxed:  # until this is done it shows the factory's command line (escapewatch)
        _confine(startup, launch)
    script = plan.in_place(command, startup.python, env, startup.locale)
    # a plain file this child can open: else python's own "can't open file" comes from an exec
    stamp = scriptcache.readable_stamp(script[0]) if script is not None else None
    if script is not None and not (os.path.isabs(script[0]) and stamp is not None
                                   and heldmodules.shadowed(os.path.dirname(script[0]),
                                                            startup.held_now()) is None
                                   and _show_as(command, env)):
        script = None  # exec, below: its imports or /proc/<pid>/cmdline could not be exact
    if script is not None:
        code = (offered.code if offered is not None and offered.path == script[0]
                and offered.stamp == stamp else None)
        _run_in_place(script[0], script[1], command, env, startup, ignored,
                      None if sandboxed else err_fd, code)
    # exec: a Python launcher leaves SIGPIPE/SIGXFSZ ignored, Popen restores them.
    _set_signals(ignored, (signal.SIGPIPE, getattr(signal, "SIGXFSZ", signal.SIGPIPE))
                 if sandboxed else (), python=False)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        if sandboxed:
            os._exit(_fail_launch(f"exec failed: {command[0]!r}: {exc.strerror or exc}",
                                  sandbox.EXIT_EXEC_FAILED))
        raise _Refused(exc, f"cannot run {command[0]}", command[0]) from None


_PR_SET_MM, _PR_SET_MM_MAP = 35, 14
_shown: list[Any] = []  # the blocks /proc/<pid>/cmdline and environ now point into
_bound: list[Any] = []  # the C library, looked up once (libc)


def libc() -> Any:
    """The C library with ``prctl`` and ``sbrk`` looked up, once: by the factory before its
    first fork (``server.Factory``), so each child does not open and look them up again; not
    at import, where the darwin profile's tripwire would see a Linux call."""
    if not _bound:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.sbrk.restype = ctypes.c_void_p
        lib.prctl  # noqa: B018 (looked up now: CDLL keeps it)
        _bound.append(lib)
    return _bound[0]


class _MMMap(ctypes.Structure):  # struct prctl_mm_map (linux/prctl.h)
    _fields_: ClassVar[list[tuple[str, Any]]] = [(n, ctypes.c_uint64) for n in (
        "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
        "arg_start", "arg_end", "env_start", "env_end")] + [
        ("auxv", ctypes.c_void_p), ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]


def _show_as(argv: list[str], env: Mapping[str, str]) -> bool:
    """Make ``/proc/<pid>/cmdline`` and ``environ`` (ps, psutil, a probe) read as an exec'd
    process's (``PR_SET_MM_MAP``: no capability needed, the kernel checks the layout). False
    where the kernel refuses (no CONFIG_CHECKPOINT_RESTORE): the caller execs instead."""
    lib = libc()
    with open("/proc/self/stat", "rb") as f:
        data = f.read()
    st = [int(x) for x in data[data.rfind(b")") + 2:].split()[1:]]  # from field 4 (ppid)
    m = _MMMap()
    # stat fields 26-28 (code, stack) and 45-51 (data, brk, args, env); index = field - 4
    m.start_code, m.end_code, m.start_stack = st[22], st[23], st[24]
    m.start_data, m.end_data, m.start_brk = st[41], st[42], st[43]
    m.brk = lib.sbrk(0) or 0
    blocks = []
    for items in (argv, [f"{k}={v}" for k, v in env.items()]):
        block = b"".join(os.fsencode(x) + b"\0" for x in items) or b"\0"
        buf = ctypes.create_string_buffer(block, len(block))
        blocks.append(buf)
    m.arg_start = ctypes.addressof(blocks[0])
    m.arg_end = m.arg_start + len(blocks[0])
    m.env_start = ctypes.addressof(blocks[1])
    m.env_end = m.env_start + len(blocks[1])
    m.auxv, m.auxv_size, m.exe_fd = None, 0, 0xFFFFFFFF
    if lib.prctl(_PR_SET_MM, _PR_SET_MM_MAP, ctypes.byref(m), ctypes.sizeof(m), 0) != 0:
        return False
    _shown.extend(blocks)  # must live as long as the process
    return True


def _fail_launch(message: str, code: int = sandbox.EXIT_SETUP_FAILED) -> int:
    return launcher.refuse(code, message)


def _run_in_place(script: str, argv: list[str], command: list[str], env: Mapping[str, str],
                  startup: Startup, ignored: frozenset[int], err_fd: int | None,
                  code_of_script: CodeType | None) -> NoReturn:
    import pkgutil
    import runpy

    _set_signals(ignored, (), python=True)
    lib = libc()
    if lib.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0:
        lib.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # an exec'd child is dumpable again too
    os.environ.clear()
    os.environ.update(env)
    for k, v in startup.env_added.items():
        os.environ.setdefault(k, v)
    sys.argv = argv
    sys.orig_argv = command
    sys.path[:] = startup.sys_path
    heldmodules.forget(startup.held_now(), startup.meta_path, startup.path_hooks)
    if err_fd is not None:
        os.close(err_fd)  # started: from here on it is the script's own doing
    code = 0
    try:
        # run_path's own steps for a plain file, with the code compiled once where the
        # factory has it (scriptcache.py); its importer lookup stays: a fresh start makes it
        # too (sys.path_importer_cache), and a folder or zip goes runpy's way.
        if code_of_script is not None and pkgutil.get_importer(script) is None:
            runpy._run_module_code(code_of_script, None, "__main__", pkg_name="",  # type: ignore[attr-defined]
                                   script_name=script)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:  # what python prints for an uncaught exception
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next  # python shows the script's frames only (none: a SyntaxError)
        sys.excepthook(type(exc), exc, tb)
        code = 1
        if isinstance(exc, KeyboardInterrupt):
            code = -signal.SIGINT
    os._exit(_finalize(code))


def _exit_code(exc: SystemExit) -> int:
    c = exc.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c
    with contextlib.suppress(Exception):
        print(c, file=sys.stderr)
    return 1


def _finalize(code: int) -> int:
    """What Py_FinalizeEx does before the process ends: threads, atexit, stdio flush."""
    threading = sys.modules.get("threading")
    if threading is not None:
        with contextlib.suppress(BaseException):
            threading._shutdown()
    import atexit

    atexit._run_exitfuncs()
    for i, stream in enumerate((sys.stdout, sys.stderr)):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            if i == 0 and code == 0:
                code = 120  # python's own exit status when stdout cannot be flushed
    if code < 0:  # KeyboardInterrupt: python ends by the signal itself
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code & 0xFF
