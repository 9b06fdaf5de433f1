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
- A 4xx answer is not retried (the same report would be refused again). Each cause of a
  refusal (status and the portal's reason) is logged once, as a warning, when it first
  happens; ``status()`` keeps every cause with its count and last time, so ``oarbank-agent
  status`` says why the portal is not taking this node's reports. A report the portal took but
  did not apply (``applied: false``) is logged and kept the same way.
- Every report carries ``heartbeat_s`` (the portal judges staleness by it) and the node's
  token (``Authorization: Bearer``, from ``--portal-token-file``) when there is one.
- An overloaded portal answers 503 (or 429) with ``Retry-After``: the sender waits that long
  plus up to half again (alive.py), changes or not, then posts its whole current snapshot.
- Still alive: to a portal that offers it (``alive`` in its answer), a report that says
  nothing new goes as a short still-alive, the whole snapshot at least every ``full_every``
  posts (alive.py).
- ``send_last()``: the agent is stopping; one last report says so (``agent_stopped``, every
  service stopped), bounded by ``timeout_s``, so the portal shows "agent stopped" instead of
  a node that went quiet.

URL: ``http://HOST:PORT[/prefix]``, ``https://HOST[:PORT][/prefix]`` (verified against the
system's CAs or ``ca_file``) or ``unix:/path/to/socket``; the post goes to
``<prefix>/v1/heartbeat`` through ``portalhttp.PortalClient`` (the agent's one portal client).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from .alive import AliveState, retry_after_s
from .portalhttp import Answer, PortalClient, PortalError, PortalURL, read_token_file

__all__ = ["HeartbeatSender", "PortalURL", "read_token_file"]

log = logging.getLogger("oarbank_agent.reporting.heartbeat")

_REPEAT_WARNING_S = 60.0


class HeartbeatSender:
    def __init__(self, url: str, report: Callable[[], dict[str, Any]], period_s: float = 10.0,
                 *, timeout_s: float = 5.0, debounce_s: float = 0.25, retries: int = 3,
                 backoff_initial_s: float = 0.5, backoff_max_s: float = 8.0,
                 token: str | None = None, ca_file: str | None = None,
                 full_every: int = 6) -> None:
        if period_s <= 0:
            raise ValueError(f"heartbeat period must be > 0 seconds, got {period_s}")
        self.client = PortalClient(url, token=token, ca_file=ca_file)
        self.url = self.client.url
        self._token = token
        self._report = report
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.debounce_s = debounce_s
        self.retries = retries
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._alive = AliveState(full_every)
        self._rng = random.Random()
        self._hold_s: float | None = None  # a portal's Retry-After, jittered: wait, then post
        self.deferred = 0  # posts the portal asked to come back later (Retry-After)
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
        # cause ("HTTP 401: <reason>" or "not applied: <reason>") -> count, last time
        self.refusals: dict[str, dict[str, Any]] = {}

    def status(self) -> dict[str, Any]:
        """For ``oarbank-agent status`` and the metrics textfile."""
        return {"portal": self.url.text, "period_s": self.period_s,
                "token": self._token is not None, "posts_ok": self.posts_ok,
                "posts_failed": self.posts_failed, "last_error": self.last_error,
                "deferred": self.deferred,
                "down_for_s": (round(time.monotonic() - self.down_since, 1)
                               if self.down_since is not None else None),
                "refused": [{"cause": c} | v for c, v in self.refusals.items()]}

    def _refused(self, cause: str) -> None:
        """Count a refusal; the first of its cause is a warning, the rest stay in status."""
        seen = self.refusals.get(cause)
        if seen is None:
            log.warning("heartbeat: portal %s refused this node's report: %s (logged once per "
                        "cause; `oarbank-agent status` counts them)", self.url.text, cause)
            seen = self.refusals[cause] = {"count": 0}
        seen["count"] += 1
        seen["last_at"] = time.time()

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
            hold, self._hold_s = self._hold_s, None
            if hold is not None:  # the portal asked for this pause: changes wait too
                await asyncio.sleep(hold)
                continue
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

    def _body(self, last: bool = False) -> bytes:
        doc = self._report()
        doc["heartbeat_s"] = self.period_s
        _without_nul(doc)
        if last:
            doc["agent_stopped"] = True
            for row in doc.get("services", []):
                row.update(running=False, ready=False, accepting=False, users=0)
            self._alive.forget()
            return json.dumps(doc).encode()
        return json.dumps(self._alive.body(doc)).encode()

    async def send_last(self) -> bool:
        """Stop the loop, then post one last report: the agent stopped, its services with it.
        One try, bounded by ``timeout_s``; True when the portal took it."""
        await self.aclose()
        try:
            body = self._body(last=True)
            status, reply, _ = await self._post(body)
        except Exception as e:  # a stopping agent logs and goes on stopping
            log.warning("heartbeat: the last report (agent stopped) did not reach %s: %s",
                        self.url.text, str(e) or type(e).__name__)
            return False
        if not 200 <= status < 300:
            log.warning("heartbeat: the last report (agent stopped) was refused by %s: "
                        "HTTP %d: %s", self.url.text, status, _reason(reply))
            return False
        return True

    async def _post_newest(self) -> None:
        backoff = self.backoff_initial_s
        for attempt in range(self.retries + 1):
            try:
                body = self._body()
            except Exception:  # the report is the agent's; a bug there must not end heartbeats
                log.exception("heartbeat: building the node report failed; skipping this post")
                return
            short = self._alive.last_was_short
            try:
                status, reply, retry_after = await self._post(body)
            except asyncio.TimeoutError:
                error = f"no answer within {self.timeout_s:g} s"
            except (OSError, PortalError) as e:
                error = str(e) or type(e).__name__
            else:
                if 200 <= status < 300:
                    self._delivered()
                    applied, why = _applied(reply)
                    self._alive.answered(_doc(reply))
                    if not applied:
                        self._refused(f"not applied: {why}")
                    return
                self._alive.forget()  # whatever went wrong, the next post is whole
                if status == 409 and short:
                    continue  # the portal lost what the still-alive named: send it whole
                reason = _reason(reply)
                hold = retry_after_s(retry_after, self._rng) if status in (429, 503) else None
                if hold is not None:
                    # overloaded: come back when asked, with the whole snapshot
                    self.deferred += 1
                    self._hold_s = hold
                    self._failed(f"HTTP {status}: {reason}", retrying=False,
                                 then=f"next try in {hold:.1f} s (Retry-After)")
                    return
                if 400 <= status < 500:
                    # Sending the same report again would be refused again: count it, log its
                    # cause once, wait for the next period or change.
                    self.posts_failed += 1
                    self.last_error = f"HTTP {status}: {reason}"
                    self._refused(self.last_error)
                    return
                error = f"HTTP {status}: {reason}"
            self._alive.forget()
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

    async def _post(self, body: bytes) -> Answer:
        """(status, body, Retry-After), bounded by ``timeout_s``."""
        return await self.client.post("/v1/heartbeat", body, self.timeout_s)

    def _failed(self, error: str, *, retrying: bool, then: str | None = None) -> None:
        self.posts_failed += 1
        self.last_error = error
        now = time.monotonic()
        then = then or ("retrying" if retrying
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

_ROW_TEXTS = ("error", "health", "held")


def _without_nul(doc: dict[str, Any]) -> None:
    """Each NUL in a row's text as U+FFFD: a service's error may carry whatever its process
    wrote, and a portal refuses a report with NUL in it (PostgreSQL's text cannot hold one),
    which would leave the node unreported for as long as the error stands."""
    for row in doc.get("services", []):
        for key in _ROW_TEXTS:
            text = row.get(key)
            if isinstance(text, str) and "\x00" in text:
                row[key] = text.replace("\x00", "\ufffd")


def _doc(reply: bytes) -> Any:
    try:
        return json.loads(reply)
    except ValueError:
        return None


def _applied(reply: bytes) -> tuple[bool, str]:
    """The portal's ``applied`` flag and reason (a reply without one counts as applied)."""
    try:
        doc = json.loads(reply)
    except ValueError:
        return True, ""
    if isinstance(doc, dict) and doc.get("applied") is False:
        return False, str(doc.get("reason") or "no reason given")
    return True, ""


def _reason(reply: bytes) -> str:
    """The portal's ``{"error": ...}`` if it sent one, else the start of the body."""
    try:
        doc = json.loads(reply)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            return str(doc["error"])
    except ValueError:
        pass
    return reply[:200].decode("utf-8", "replace").strip() or "(no body)"
