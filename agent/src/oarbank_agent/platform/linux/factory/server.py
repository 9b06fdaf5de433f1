"""The factory process: ``python -I -m oarbank_agent.platform.linux.factory fd:<n> [--confine]``.

One per agent, started by ``client.FactoryClient``. It imports, once, what every child would
otherwise import again (the SDK's sandbox launcher and its seccomp binding, ``runpy``), then
waits on its socket. A script run in place keeps only the standard library of that: the rest
it imports afresh, as a fresh interpreter would (``heldmodules.forget``). Per ``spawn`` it
forks a child (``child.run``), answers ``started`` (or ``failed``) as soon as the child is past
the point where the direct path's ``Popen`` returns, and ``exit`` when it reaps the child. A
child's start is read from the poll loop: the next spawn forks while one is still starting.
Single-threaded on purpose: ``fork`` copies only the calling thread, and user namespaces and
Landlock refuse multi-threaded callers.

It ends when the agent's end of the socket closes (the agent died or stopped): the children
go on, as those of a direct spawn outlive the agent.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from oarbank_agent.platform.linux.factory import child, intocgroup, scriptcache, selfconfine, wire
from oarbank_sdk import sandbox
from oarbank_sdk.protocol import current_transport

__all__ = ["main"]


def _launcher_sys_path() -> list[str]:
    """sys.path of a ``python -I -S`` start-up (the launcher's, before its two folders)."""
    out = subprocess.run([sys.executable, "-I", "-S", "-c",
                          "import sys,json;print(json.dumps(sys.path))"],
                         capture_output=True, text=True, timeout=60, check=True, env={})
    return [p for p in json.loads(out.stdout) if p]


def _fresh_modules() -> frozenset[str]:
    """sys.modules of a fresh ``python -I`` start (a script's sees the same): what a child run
    in place keeps of the modules outside the standard library (``heldmodules.forget``)."""
    out = subprocess.run([sys.executable, "-I", "-c", "import sys;print(*sys.modules)"],
                         capture_output=True, text=True, timeout=60, check=True, env={})
    return frozenset(out.stdout.split())


def _preload(guard_pid: int, launcher_sys_path: list[str]) -> None:
    """What children would each do again: imported (and the seccomp programs and Landlock's
    read list built, for the launcher's sys.path that ``child._confine`` gives) once here."""
    # runpy and pkgutil: runpy.run_path imports pkgutil on each call otherwise. The standard
    # library a runner or service of the SDK imports (http.client, email, http.server, json,
    # ...: 40-50 ms of a modelserver runner's 60, measured): it stays loaded in every child,
    # as the standard library does (child.py). The SDK's own modules are forgotten in each
    # child (``heldmodules.forget``): a script imports them afresh, from its bundle where it has
    # one. argparse and concurrent.futures: what runners use most.
    import argparse  # noqa: F401
    import concurrent.futures  # noqa: F401
    import pkgutil  # noqa: F401
    import runpy  # noqa: F401

    import oarbank_sdk.service_endpoint  # noqa: F401

    sandbox.preload((guard_pid,), launcher_sys_path)


@dataclass
class _Starting:
    """A child forked and not yet past its start: the factory reads its error pipe from the
    poll loop, so the next spawn forks meanwhile instead of waiting on this one."""

    rid: int
    pid: int
    err_r: int
    offered: scriptcache.Compiled | None
    script: str | None
    chunks: list[bytes] = field(default_factory=list)
    status: int | None = None  # its wait status, where it was reaped before its pipe closed


class Factory:
    def __init__(self, sock: socket.socket, startup: child.Startup) -> None:
        self.sock = sock
        self.startup = startup
        self.children: set[int] = set()  # said started; their exit is still to say
        self.starting: dict[int, _Starting] = {}  # by error pipe
        self.scripts = scriptcache.ScriptCache()  # compiled once, for the next children
        child.libc()  # looked up once here, not in each child
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        self.poller = select.poll()

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        wire.send_message(self.sock, {"op": "hello", "pid": os.getpid()})
        self.poller.register(self.sock.fileno(), select.POLLIN)
        self.poller.register(self.wake_r, select.POLLIN)
        while True:
            for fd, _ev in self.poller.poll():
                if fd == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_r, 512):
                            pass
                elif fd == self.sock.fileno():
                    got = wire.recv_message(self.sock)
                    if got is None:
                        return  # the agent is gone
                    msg, fds = got
                    try:
                        if msg.get("op") == "spawn":
                            self.spawn(msg, fds)
                    finally:
                        for x in fds:
                            os.close(x)
                elif fd in self.starting:
                    self.read_start(self.starting[fd])
            self.reap()

    def spawn(self, req: dict[str, Any], fds: list[int]) -> None:
        st = self.startup
        script = scriptcache.script_of(req["argv"], req["env"], st.python, st.boot, st.locale)
        offered = self.scripts.offer(script)
        st.held_now()  # taken here once, not in every child (heldmodules.py)
        err_r, err_w = os.pipe()
        join = req.get("join")
        try:
            # born in its group where the system allows (intocgroup.py), else it joins it
            pid = intocgroup.fork_into(os.path.dirname(join)) if join else None
            if pid is not None:
                req = {**req, "join": None}
            else:
                pid = os.fork()
        except OSError as exc:
            os.close(err_r)
            os.close(err_w)
            self._reply({"op": "failed", "id": req["id"], "errno": exc.errno or errno.EAGAIN,
                         "error": f"fork failed: {exc.strerror}"})
            return
        if pid == 0:  # the child: never returns here
            os.close(err_r)
            self.sock.detach()
            child.run(req, fds, self.startup, err_w, offered)
        os.close(err_w)
        # Said at once: a factory that dies before ``started`` leaves a child the agent must
        # still be able to find and end.
        self._reply({"op": "forked", "id": req["id"], "pid": pid})
        self.starting[err_r] = _Starting(req["id"], pid, err_r, offered, script)
        self.poller.register(err_r, select.POLLIN)

    def read_start(self, s: _Starting) -> None:
        """Its error pipe is readable: what it says, or EOF (exec'd, running in place, or
        sandboxing: child.py says when). Either way ``started`` or ``failed`` goes before
        its ``exit``: the agent knows a pid only from ``started``."""
        try:
            data = os.read(s.err_r, 4096)
        except InterruptedError:
            return
        if data:
            s.chunks.append(data)
            return
        self.poller.unregister(s.err_r)
        os.close(s.err_r)
        del self.starting[s.err_r]
        if s.chunks:
            try:
                why = json.loads(b"".join(s.chunks))
            except ValueError:
                why = {"errno": 0, "error": b"".join(s.chunks).decode(errors="replace")}
            if s.status is None:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(s.pid, 0)  # it exits right after saying why
            self._reply({"op": "failed", "id": s.rid, **why})
            return
        self._reply({"op": "started", "id": s.rid, "pid": s.pid, "cached": s.offered is not None})
        if s.status is not None:  # it has ended already
            self._reply({"op": "exit", "pid": s.pid, "code": os.waitstatus_to_exitcode(s.status)})
        else:
            self.children.add(s.pid)
        if s.offered is None:
            self.scripts.learn(s.script)  # off this spawn's path: the next child's

    def reap(self) -> None:
        while self.children or self.starting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children.discard(pid)
                self._reply({"op": "exit", "pid": pid,
                             "code": os.waitstatus_to_exitcode(status)})
                continue
            for s in self.starting.values():
                if s.pid == pid:  # its exit waits for its start to be said (read_start)
                    s.status = status

    def _reply(self, msg: dict[str, Any]) -> None:
        wire.send_message(self.sock, msg)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -I -m oarbank_agent.platform.linux.factory fd:<n> [--confine]", file=sys.stderr)
        return 2
    startup_path = list(sys.path)
    transport = current_transport()
    sock = transport.open_stream(transport.parse(argv[0]))
    sock.setblocking(True)
    startup = child.capture(sandbox.LAUNCHER_BOOT, _launcher_sys_path())
    startup.sys_path = startup_path
    startup.fresh_modules = _fresh_modules()
    # The agent: every launch guards it (sandboxing.SandboxPolicy).
    _preload(os.getppid(), startup.launcher_sys_path)
    if "--confine" in argv[1:]:
        selfconfine.confine()
    # else dumpable, as the agent is without the sandbox: a child whose parent is the factory
    # reads its /proc as it reads the agent's when started directly
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        Factory(sock, startup).serve()
    return 0
