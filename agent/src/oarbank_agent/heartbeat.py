"""Heartbeats: the node's report posted to the portal (contract section 6).

``HeartbeatSender(url, report, period_s)`` runs as one task on the agent's asyncio loop:

    start() --> post at once --> wait (period_s, or a change + debounce) --> post --> ...

- ``notify_change()`` wakes it; changes that arrive within ``debounce_s`` of each other are
  one post (a service going starting -> ready -> users 3 is one heartbeat, not three).
- Each attempt calls ``report()`` anew, so the newest report wins: a retry never resends a
  state the node has already left.
- A portal that is down, slow or refusing never blocks or crashes the agent: every post is
  bounded by ``timeout_s``, a failed post is retried ``retries`` times with doubling backoff,
  then the sender waits for the next period or change. The first failure of an outage is a
  warning, its end an info line; failures in between are logged at most once a minute.
- A 4xx answer is not retried (the same report would be refused again); it is logged with the
  portal's reason.

URL: ``http://HOST:PORT[/prefix]`` or ``unix:/path/to/socket``; the post goes to
``<prefix>/v1/heartbeat``. HTTP/1.1 over asyncio streams, ``Connection: close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

__all__ = ["HeartbeatSender", "PortalURL"]

log = logging.getLogger("oarbank_agent.heartbeat")

_MAX_REPLY = 64 * 1024
_REPEAT_WARNING_S = 60.0
_T = TypeVar("_T")


class _BadReply(Exception):
    pass


class PortalURL:
    """A parsed portal address; ``ValueError`` with a readable message when it is not one."""

    def __init__(self, url: str) -> None:
        self.text = url
        self.unix_path: str | None = None
        self.host = "localhost"
        self.port = 80
        self.prefix = ""
        if url.startswith("unix:"):
            path = url[len("unix:"):]
            if path.startswith("//"):
                path = path[2:]
            if not path.startswith("/"):
                raise ValueError(f"portal URL {url!r}: unix: needs an absolute socket path "
                                 "(unix:/path/to/socket)")
            self.unix_path = path
            return
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"portal URL {url!r}: expected http://HOST:PORT or "
                             "unix:/path/to/socket")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"portal URL {url!r}: bad port") from None
        self.host = parts.hostname
        self.port = port or 80
        self.prefix = parts.path.rstrip("/")

    @property
    def host_header(self) -> str:
        return "localhost" if self.unix_path else f"{self.host}:{self.port}"


class HeartbeatSender:
    def __init__(self, url: str, report: Callable[[], dict[str, Any]], period_s: float = 10.0,
                 *, timeout_s: float = 5.0, debounce_s: float = 0.25, retries: int = 3,
                 backoff_initial_s: float = 0.5, backoff_max_s: float = 8.0) -> None:
        if period_s <= 0:
            raise ValueError(f"heartbeat period must be > 0 seconds, got {period_s}")
        self.url = PortalURL(url)
        self._report = report
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.debounce_s = debounce_s
        self.retries = retries
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._changed = asyncio.Event()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        # What a status line or a test may read:
        self.posts_ok = 0
        self.posts_failed = 0
        self.last_error: str | None = None
        self.down_since: float | None = None  # monotonic start of the current outage
        self._last_warning = 0.0

    # -- control ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start posting; call on the agent's running loop."""
        if self._task is not None:
            raise RuntimeError("heartbeat sender already started")
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="heartbeat")

    def notify_change(self) -> None:
        """A service changed state: post soon (debounced). Safe from any thread."""
        loop = self._loop
        if loop is None:
            self._changed.set()  # before start(): the first post happens at once anyway
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._changed.set()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._changed.set)

    async def aclose(self) -> None:
        """Stop; a post in flight is abandoned (its connection closed)."""
        task, self._task = self._task, None
        if task is None:
            return
        # The flag ends the loop even if a cancel is lost in a race with a finishing post.
        self._closing = True
        self._changed.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._closing:
            self._changed.clear()
            await self._post_newest()
            if self._closing:
                break
            if not await self._wait_change(self.period_s):
                continue  # the period is up: post again
            # A change: let the rest of its burst arrive, then post once for all of it.
            await asyncio.sleep(self.debounce_s)

    async def _wait_change(self, timeout: float) -> bool:
        """True on a change, False when ``timeout`` passed first. (Not asyncio.wait_for: on
        Python < 3.12 it can swallow a cancel that races with its result.)"""
        waiter = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()
        return self._changed.is_set()

    async def _post_newest(self) -> None:
        backoff = self.backoff_initial_s
        for attempt in range(self.retries + 1):
            try:
                body = json.dumps(self._report()).encode()
            except Exception:  # the report is the agent's; a bug there must not end heartbeats
                log.exception("heartbeat: building the node report failed; skipping this post")
                return
            try:
                status, reply = await _bounded(self._post(body), self.timeout_s)
            except asyncio.TimeoutError:
                error = f"no answer within {self.timeout_s:g} s"
            except (OSError, _BadReply) as e:
                error = str(e) or type(e).__name__
            else:
                if 200 <= status < 300:
                    self._delivered()
                    return
                reason = _reason(reply)
                if 400 <= status < 500:
                    # Sending the same report again would be refused again: log, wait for the
                    # next period or change.
                    self.posts_failed += 1
                    self.last_error = f"HTTP {status}: {reason}"
                    log.warning("heartbeat: portal %s refused the report: HTTP %d: %s",
                                self.url.text, status, reason)
                    return
                error = f"HTTP {status}: {reason}"
            self._failed(error, retrying=attempt < self.retries)
            if attempt < self.retries:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max_s)

    def _delivered(self) -> None:
        self.posts_ok += 1
        if self.down_since is not None:
            # outage over: say so once
            log.info("heartbeat: portal %s reachable again after %.0f s", self.url.text,
                     time.monotonic() - self.down_since)
        self.down_since = None
        self.last_error = None

    def _failed(self, error: str, *, retrying: bool) -> None:
        self.posts_failed += 1
        self.last_error = error
        now = time.monotonic()
        then = ("retrying" if retrying
                else f"next try in {self.period_s:g} s or on the next service change")
        if self.down_since is None:
            # outage begins
            self.down_since = now
            self._last_warning = now
            log.warning("heartbeat: cannot reach portal %s: %s; the agent keeps running jobs, "
                        "%s", self.url.text, error, then)
        elif now - self._last_warning >= _REPEAT_WARNING_S:
            self._last_warning = now
            log.warning("heartbeat: portal %s unreachable for %.0f s: %s; %s", self.url.text,
                        now - self.down_since, error, then)
        else:
            log.debug("heartbeat: post to %s failed: %s", self.url.text, error)

    # -- one HTTP post ---------------------------------------------------------------------

    async def _post(self, body: bytes) -> tuple[int, bytes]:
        u = self.url
        if u.unix_path is not None:
            reader, writer = await asyncio.open_unix_connection(u.unix_path)
        else:
            reader, writer = await asyncio.open_connection(u.host, u.port)
        try:
            head = (f"POST {u.prefix}/v1/heartbeat HTTP/1.1\r\n"
                    f"Host: {u.host_header}\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n"
                    "Connection: close\r\n"
                    "User-Agent: oarbank-agent\r\n\r\n")
            writer.write(head.encode("ascii") + body)
            await writer.drain()
            status_line = await reader.readline()
            fields = status_line.split(None, 2)
            if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
                raise _BadReply(f"not an HTTP reply: {status_line[:80]!r}")
            length = None
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length" and value.strip().isdigit():
                    length = int(value.strip())
            if length is not None:
                reply = await reader.read(min(length, _MAX_REPLY))
            else:
                reply = await reader.read(_MAX_REPLY)
        except BaseException:
            # Timed out, cancelled or broken: drop the connection at once; a graceful close
            # could wait on a portal that reads nothing.
            writer.transport.abort()
            raise
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return int(fields[1]), reply


async def _bounded(coro: Coroutine[Any, Any, _T], timeout: float) -> _T:
    """``coro``'s result, or ``asyncio.TimeoutError`` after ``timeout`` (the work is cancelled).
    A cancel of the caller always propagates (asyncio.wait_for before 3.12 may drop it)."""
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()  # its own cleanup (dropping the connection) runs on the next loop turn
        raise asyncio.TimeoutError
    return task.result()


def _reason(reply: bytes) -> str:
    """The portal's ``{"error": ...}`` if it sent one, else the start of the body."""
    try:
        doc = json.loads(reply)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            return str(doc["error"])
    except ValueError:
        pass
    return reply[:200].decode("utf-8", "replace").strip() or "(no body)"
