"""The agent's side of its process factory: start it, ask it for children, watch them end.

``FactoryClient.spawn`` returns a ``FactoryProcess``: what callers of ``procs.spawn`` use of an
``asyncio.subprocess.Process`` (``pid``, ``returncode``, ``await wait()``). The agent cannot
``waitpid`` the factory's children; their exit statuses come from the factory.

When the factory dies (killed, crashed) the statuses of the children it still had are lost
with it. Those children are ended (each one's group killed: a status nobody can know is
worse than a known kill), ``on_lost`` is called first with their handles so the agent
can release their jobs (not charged, requeued, run again), and a new factory is started.
Spawns made meanwhile wait for it. A factory that cannot be started (three times in a row)
leaves the client ``broken``: ``procs.spawn`` then starts children directly, and says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import resource
import sys
from collections.abc import Callable
from typing import Any

from oarbank_agent.eventwait import result_within, wait_event
from oarbank_agent.platform.api import Backend, FactoryLost
from oarbank_agent.platform.linux.factory import plan, wire
from oarbank_sdk.protocol import current_transport

__all__ = ["FactoryClient", "FactoryProcess", "FactoryLost", "RLIMITS"]

log = logging.getLogger("oarbank_agent.factory")

RLIMITS = tuple(getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_"))
_START_TIMEOUT_S = 60.0
_MAX_FAILED_STARTS = 3


class FactoryProcess:
    """A child of the factory, as far as the agent can see it."""

    def __init__(self, pid: int, kind: str = "", label: str = "") -> None:
        self.pid = pid
        self.kind = kind  # procs.GroupRecord's: op | service | runner
        self.label = label
        self.returncode: int | None = None
        self.lost = False  # the factory died under it (returncode is then our own kill)
        self._done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def _exited(self, code: int) -> None:
        if not self._done.done():
            self.returncode = code
            self._done.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._done)


class FactoryClient:
    def __init__(self, *, confine: bool, backend: Backend,
                 on_lost: Callable[[list[FactoryProcess]], None] | None = None) -> None:
        self.confine = confine  # the factory drops what children need not inherit
        self.backend = backend  # passed in: this module is the backend's, below its choice
        self.on_lost = on_lost
        self.restarts = 0
        self.from_cache = 0  # children that ran the factory's compiled copy of their script
        self.broken: str | None = None  # why spawns go the direct way now
        self._proc: asyncio.subprocess.Process | None = None
        self._sock: Any = None
        self._decoder = wire.Decoder()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[FactoryProcess], str, str]] = {}
        self._forked: dict[int, int] = {}  # spawn id -> pid, until started or failed
        # Spawns given up (cancelled: a shutdown, a stop) after the factory was asked: their
        # children are ended as soon as their pids are known, until started or failed.
        self._abandoned: set[int] = set()
        self._live: dict[int, FactoryProcess] = {}
        self._hello: asyncio.Future[int] | None = None
        self._ready = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self._closing = False
        self._dead = True  # no live factory behind _sock (until start() gets its hello)
        self._restarting: asyncio.Task[None] | None = None
        self._orphan_watch: set[asyncio.Task[None]] = set()

    # --- the factory process --------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._ready.is_set() else None

    async def start(self) -> None:
        """Start the factory and wait for its hello. Raises OSError when it cannot start."""
        transport = current_transport()
        ours, theirs = transport.pair(child=True)
        argv = [sys.executable, "-I", "-m", "oarbank_agent.platform.linux.factory",
                transport.format(theirs.fileno())] + (["--confine"] if self.confine else [])
        loop = asyncio.get_running_loop()
        try:
            # An empty environment: its locale is that of the contract's job and op
            # environments (plan.in_place runs a script in place only for the same one).
            self._proc = await asyncio.create_subprocess_exec(
                *argv, env={}, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=None,
                **transport.inheritable_kwargs(theirs.fileno()))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self._decoder = wire.Decoder()
        self._hello = loop.create_future()
        self._dead = False
        self.backend.streams.watcher(loop).on_readable(ours.fileno(), self._readable)
        try:
            said_hello, _ = await result_within(asyncio.shield(self._hello), _START_TIMEOUT_S)
            why = "" if said_hello else "no hello"
        except FactoryLost as exc:
            why = str(exc) or "no hello"
        if why:
            await self._drop_process()
            raise OSError(f"the process factory did not start: {why}")
        self._ready.set()
        log.info("process factory: pid %d%s", self._proc.pid,
                 " (confined)" if self.confine else "")

    async def close(self) -> None:
        """Agent shutdown: the factory ends (its children, if any, go on)."""
        self._closing = True
        if self._restarting is not None:
            self._restarting.cancel()
            with contextlib.suppress(BaseException):
                await self._restarting
        await self._drop_process()
        for t in list(self._orphan_watch):
            with contextlib.suppress(BaseException):
                await t

    async def _drop_process(self) -> None:
        self._ready.clear()
        if self._sock is not None:
            with contextlib.suppress(Exception):
                self.backend.streams.watcher(
                    asyncio.get_running_loop()).off_readable(self._sock.fileno())
            self._sock.close()
            self._sock = None
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()  # its socket is closed: it is on its way out anyway
            exited, _ = await result_within(proc.wait(), 10)
            if not exited:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    def footprint(self) -> dict[str, Any]:
        """The factory's share of the agent's footprint (status)."""
        pid = self.pid
        rep: dict[str, Any] = {"mode": "on", "pid": pid, "restarts": self.restarts,
                               "children": len(self._live), "note": self.broken,
                               "scripts_from_cache": self.from_cache}
        if pid is not None:
            rep.update(self.backend.factory.footprint(pid))  # rss_bytes, fds
        return rep

    # --- spawning -------------------------------------------------------------------------

    async def spawn(self, argv: list[str], *, env: dict[str, str], cwd: str,
                    fds: list[tuple[int, int]], join: str | None,
                    kind: str = "", label: str = "") -> FactoryProcess:
        """Start ``argv``; ``fds``: (agent's descriptor, its number in the child); ``join``:
        the file the child writes its pid into first (its group's, ``Slot.factory_kwargs``;
        None: nothing to join). Raises
        OSError as ``Popen`` does (the factory's message), ``FactoryLost`` if it died."""
        while not self._ready.is_set():
            if self.broken or self._closing:
                raise FactoryLost(f"no process factory: {self.broken or 'closing'}")
            # Not wait_for: on Python < 3.12 it may lose a shutdown's cancel (eventwait.py).
            if not await wait_event(self._ready, _START_TIMEOUT_S):
                raise FactoryLost(f"no process factory within {_START_TIMEOUT_S:g}s")
        rid = next(self._ids)
        msg = {"op": "spawn", "id": rid, "argv": argv, "env": env, "cwd": cwd,
               "umask": self.backend.statedir.umask(), "join": join,
               "fds": [n for _fd, n in fds],
               "rlimits": [[r, *resource.getrlimit(r)] for r in RLIMITS],
               "ignored": plan.inherited_ignores()}
        fut: asyncio.Future[FactoryProcess] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (fut, kind, label)
        asked = False

        def sent() -> None:
            nonlocal asked
            asked = True

        try:
            await self._send(wire.encode(msg), [fd for fd, _n in fds], sent)
            return await fut  # it may have exited already: the handle knows
        except asyncio.CancelledError:
            if asked:  # the factory forks it anyway: nobody else would ever end it
                self._give_up(rid, fut)
            raise
        finally:
            self._pending.pop(rid, None)
            self._forked.pop(rid, None)

    def _give_up(self, rid: int, fut: asyncio.Future[FactoryProcess]) -> None:
        """A spawn's caller is gone: end its child now if it has one, or once it has."""
        # The cancel reached ``fut`` too unless the factory had answered it already.
        if fut.done() and not fut.cancelled():
            if fut.exception() is None:  # started: never handed over
                proc = fut.result()
                if proc.returncode is None:
                    self._end_child(proc.pid)
            return  # else failed: nothing runs
        pid = self._forked.get(rid)
        if pid is not None:
            self._end_child(pid)
        self._abandoned.add(rid)  # state: its forked/started ends it; started/failed forgets it

    def _end_child(self, pid: int, quiet: bool = False) -> None:
        """Its group, and the child itself: it may not be in its own session yet. ``quiet``:
        the caller logs why (or has already, for this child)."""
        if not quiet:
            log.info("process factory: ending pid %d, forked for a spawn given up", pid)
        self.backend.groups.of(pid).kill(also=pid)

    async def _send(self, data: bytes, fds: list[int],
                    sent: Callable[[], None] | None = None) -> None:
        """``data`` to the factory, ``fds`` with its first byte; ``sent`` is called once that
        byte went. Cancelled after it, the rest still goes (under the lock: a message cut
        short would garble every one after it), then the cancel is raised."""
        transport = current_transport()
        loop = asyncio.get_running_loop()
        async with self._send_lock:
            sock = self._sock
            if sock is None:
                raise FactoryLost("the process factory is gone")
            while True:
                try:
                    n = transport.send_handles(sock, data, fds)
                    break
                except BlockingIOError:
                    writable = loop.create_future()
                    io = self.backend.streams.watcher(loop)
                    io.on_writable(sock.fileno(), writable.set_result, None)
                    try:
                        await writable
                    finally:
                        io.off_writable(sock.fileno())
                except OSError as exc:
                    raise self._send_failed(exc) from None
            if sent is not None:
                sent()
            if n < len(data):  # the descriptors went with the first byte
                rest = asyncio.ensure_future(loop.sock_sendall(sock, data[n:]))
                cancelled = False
                while not rest.done():
                    try:
                        await asyncio.shield(rest)
                    except asyncio.CancelledError:
                        cancelled = True
                    except OSError:
                        break
                failure = rest.exception()
                if failure is not None:
                    raise self._send_failed(failure) from None
                if cancelled:
                    raise asyncio.CancelledError

    def _send_failed(self, exc: BaseException) -> FactoryLost:
        """The factory's socket refused a send: it is lost (what to raise)."""
        self._lost(f"sending to it failed: {exc}")
        return FactoryLost(f"the process factory is gone ({exc})")

    # --- what the factory says ------------------------------------------------------------

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            data = sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost("its socket closed")
            return
        try:
            msgs = self._decoder.feed(data)
        except ValueError as exc:
            self._lost(f"it sent garbage ({exc})")
            return
        for msg in msgs:
            self._dispatch(msg)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "hello" and self._hello is not None and not self._hello.done():
            self._hello.set_result(int(msg["pid"]))
        elif op == "forked":
            rid, pid = int(msg["id"]), int(msg["pid"])
            if rid in self._abandoned:
                self._end_child(pid)
            else:
                self._forked[rid] = pid
        elif op == "started":
            rid, pid = int(msg["id"]), int(msg["pid"])
            pending = self._pending.get(rid)
            proc = self._live[pid] = FactoryProcess(pid, *(pending[1:] if pending else ()))
            if msg.get("cached") is True:  # offered its script's code (scriptcache.py)
                self.from_cache += 1
            if pending is not None and not pending[0].done():
                pending[0].set_result(proc)
            if rid in self._abandoned:
                self._abandoned.discard(rid)
                self._end_child(pid, quiet=True)  # again: its exit comes, and clears _live
        elif op == "failed":
            rid = int(msg["id"])
            self._abandoned.discard(rid)
            pending = self._pending.get(rid)
            if pending is not None and not pending[0].done():
                pending[0].set_exception(_spawn_error(msg))
        elif op == "exit":
            ended = self._live.pop(int(msg["pid"]), None)
            if ended is not None:
                ended._exited(int(msg["code"]))

    def _lost(self, why: str) -> None:
        """The factory died: release, end and watch its children; fail what it never
        answered; start a new one."""
        if self._dead:
            return  # already handled
        self._dead = True
        loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):
            self.backend.streams.watcher(loop).off_readable(self._sock.fileno())
        was_ready = self._ready.is_set()
        self._ready.clear()
        if self._hello is not None and not self._hello.done():
            self._hello.set_exception(FactoryLost(why))
        orphans = list(self._live.values())
        self._live.clear()
        unforked = []  # their spawns fail (FactoryLost); their jobs are released too
        for rid, (fut, kind, label) in self._pending.items():
            pid = self._forked.get(rid)
            if pid is not None:  # forked, never said started: ended like the others
                orphans.append(FactoryProcess(pid, kind, label))
            else:
                unforked.append(FactoryProcess(0, kind, label))
            if not fut.done():
                fut.set_exception(FactoryLost(f"the process factory died ({why})"))
        self._forked.clear()
        self._abandoned.clear()  # their pids died with the factory's word on them
        if self._closing or not was_ready:
            return  # shutting down, or dead at start (start() says so)
        log.error("process factory died (%s): %d child(ren) in flight ended, their jobs "
                  "released; starting a new one", why, len(orphans))
        if self.on_lost is not None and (orphans or unforked):
            try:
                self.on_lost(orphans + unforked)
            except Exception:
                log.exception("process factory: on_lost failed")
        for proc in orphans:
            proc.lost = True
            self._end_child(proc.pid, quiet=True)
            t = asyncio.create_task(self._until_gone(proc))
            self._orphan_watch.add(t)
            t.add_done_callback(self._orphan_watch.discard)
        self._restarting = asyncio.create_task(self._restart(why))

    async def _until_gone(self, proc: FactoryProcess) -> None:
        """Resolve a lost child's handle once the process is gone (it is not the agent's
        child: the backend watches it)."""
        await self.backend.factory.until_gone(proc.pid)
        proc._exited(self.backend.groups.killed_returncode)

    async def _restart(self, why: str) -> None:
        await self._drop_process()
        failures = 0
        while not self._closing:
            try:
                await self.start()
                self.restarts += 1
                return
            except OSError as exc:
                failures += 1
                log.error("process factory: restart %d failed: %s", failures, exc)
                if failures >= _MAX_FAILED_STARTS:
                    self.broken = (f"the process factory died ({why}) and could not be "
                                   f"restarted ({exc}): children are started directly")
                    self._ready.set()  # wake the waiters: they go the direct way
                    self._ready.clear()
                    return
                await asyncio.sleep(0.5 * failures)


def _spawn_error(msg: dict[str, Any]) -> OSError:
    """The OSError ``Popen`` would have raised: with the file it names, the same text."""
    code = int(msg.get("errno") or 0)
    if code and msg.get("filename"):
        return OSError(code, os.strerror(code), str(msg["filename"]))
    return OSError(code, str(msg.get("error")))
