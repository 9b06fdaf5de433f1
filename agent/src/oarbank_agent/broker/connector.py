"""A connector: the agent's end of one (attempt, service) pair, where a job asks for connections.

Rules (``decide`` is the whole decision for a ``connect``, pure: no sockets, no clock reads):

1. More than ``CONNECTOR_MAX_UNRECEIVED`` ends handed over and not yet confirmed with
   ``received``: refuse ``rate_limited`` (no token is spent).
2. Over the rate limit (a token bucket per connector: a burst, then a steady rate): refuse
   ``rate_limited`` with the time until the next token.
3. Nothing queued ahead and the service ready now: hand over at once (the hot path: no task).
4. Otherwise queue it: answers go out in order, a connect waiting for its service (a start in
   flight) holds up the ones behind it on this connector only. Beyond
   ``CONNECTOR_MAX_QUEUED`` queued, the connector stops reading (the job's writes block in its
   own kernel buffer, not in the agent's memory).

Other lines: ``received`` closes the end it confirms (a stray one is ignored and counted, never
answered); a malformed line gets ``bad_request``; a line over the wire cap gets ``bad_request``
and ends the connector.

Ownership: the connector owns its agent end, its child end until ``close_child``, and each end
handed to the job until its ``received``. Closing it closes all of them. What it needs of the
broker (readiness, the hand-over, its task set) comes through the small ``Switchboard``
protocol given at construction.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from oarbank_agent import platform
from oarbank_agent.broker.channel import refusal
from oarbank_agent.broker.msgstream import MessageStream
from oarbank_agent.broker.ratelimit import TokenBucket
from oarbank_sdk.protocol import wire

__all__ = ["Connector", "Switchboard", "Verdict", "decide", "CONNECTOR_MAX_OUT",
           "CONNECTOR_MAX_QUEUED", "CONNECTOR_MAX_UNRECEIVED"]

log = logging.getLogger("oarbank_agent.broker.handover")

# Bytes the agent keeps for a job that does not read before it gives up on that job.
CONNECTOR_MAX_OUT = 256 * 1024
# Connects queued behind one that waits for its service: beyond this, stop reading the
# connector (the job's writes block in its own kernel buffer, not in our memory).
CONNECTOR_MAX_QUEUED = 64
# Ends handed to a job that has not confirmed them with `received`: beyond this the connector
# refuses connects (rate_limited) until the job confirms some.
CONNECTOR_MAX_UNRECEIVED = 256


@dataclass(frozen=True)
class Verdict:
    """``refuse`` (with ``code`` and ``detail``), ``hand_over`` or ``queue``."""

    action: str
    code: str | None = None
    detail: str | None = None


# The two verdicts of the hot path, made once (a connect costs tens of microseconds).
_HAND_OVER = Verdict("hand_over")
_QUEUE = Verdict("queue")


def decide(*, unreceived: int, bucket: TokenBucket, now: float, queued: bool,
           ready_now: Callable[[], bool]) -> Verdict:
    """What to do with one ``connect`` (rules 1-4 above). ``bucket`` is the connector's rate
    state (one token is spent when rule 2 lets the connect through); ``queued``: something is
    queued or being answered ahead of it; ``ready_now`` is asked only when it decides."""
    if unreceived >= CONNECTOR_MAX_UNRECEIVED:
        return Verdict("refuse", "rate_limited",
                       f"{unreceived} connections handed over await your 'received'; "
                       "confirm them before connecting again")
    if not bucket.take(now):
        wait = bucket.retry_after(now)
        return Verdict("refuse", "rate_limited",
                       f"over {bucket.burst} connects at once or {bucket.rate_per_s:g} a "
                       f"second on this connector; retry in {wait:.3f} s")
    if not queued and ready_now():
        # (a task and a wait_ready per connect cost ~27% of the agent's CPU per connect)
        return _HAND_OVER
    return _QUEUE


class Switchboard(Protocol):
    """What a connector needs of the broker."""

    def ready_now(self, service_key: str) -> bool:
        """True only when a connect could be handed over at once."""
        ...

    async def wait_ready(self, service_key: str) -> bool:
        """True once the service is ready; False if it will not be (never raises)."""
        ...

    def hand_over(self, conn: Connector, connect: wire.Connect) -> bool:
        """Make the connection and send both ends, or a refusal; False when the service's
        channel was gone or broke on the way (nothing was sent: the caller decides)."""
        ...

    def track(self, task: asyncio.Task[None]) -> None:
        """Keep a connector's worker task until it is done (cancelled at broker close)."""
        ...

    def forget(self, conn: Connector) -> None:
        """The connector closed."""
        ...


class Connector:
    """The agent's end of one (attempt, service) connector."""

    def __init__(
        self, board: Switchboard, loop: asyncio.AbstractEventLoop, attempt_id: str, wire_id: int,
        service_key: str, *, rate_burst: int, rate_per_s: float,
    ) -> None:
        self._board = board
        self._loop = loop
        self.attempt_id = attempt_id
        self.wire = wire_id
        self.service_key = service_key
        self.name = f"connector attempt={attempt_id} (wire {wire_id}) service={service_key}"
        # The child end goes to the attempt's runner (runner.py); ours stays here.
        agent_end, child = platform.current().streams.child_pair()
        self.child: socket.socket | None = child
        self.child_fd = child.fileno()
        self.bucket = TokenBucket(rate_burst, rate_per_s, loop.time())
        # Made once: `decide` asks it on every connect.
        self._ready_now: Callable[[], bool] = functools.partial(board.ready_now, service_key)
        # Work answered in order: a Connect to hand over, or the bytes of a refusal decided
        # when its line arrived but queued behind a connect still waiting for its service.
        self.queue: deque[wire.Connect | bytes] = deque()
        self.worker: asyncio.Task[None] | None = None
        self._retried: wire.Connect | None = None  # a connect whose hand-over met a dead channel
        self.pending: dict[int, socket.socket] = {}  # conn -> job end sent, until `received`
        self.bad_requests = 0
        self.stray_receipts = 0
        self.closed = False
        self.stream = MessageStream(
            loop,
            agent_end,
            name=self.name,
            on_line=self._on_line,
            on_overlong=self._on_overlong,
            on_broken=lambda reason: self.close(reason),
            max_out=CONNECTOR_MAX_OUT,
        )
        self.stream.start()

    # --- lifecycle ----------------------------------------------------------------------------

    def close_child(self) -> None:
        if self.child is not None:
            self.child.close()
            self.child = None

    def close(self, reason: str) -> None:
        if self.closed:
            return
        # open -> closed: the job sees EOF; connects still queued or waiting are dropped.
        self.closed = True
        extra = f"; {self.bad_requests} bad requests" if self.bad_requests else ""
        if self.stray_receipts:
            extra += f"; {self.stray_receipts} stray receipts ignored"
        if self.stream.foreign_fds_closed:
            extra += f"; {self.stream.foreign_fds_closed} attached descriptors closed"
        # Routine ends (every attempt's) at debug; a peer cut off or misbehaving stays visible.
        routine = reason in ("attempt ended", "broker closed", "peer closed its end") and not extra
        log.log(logging.DEBUG if routine else logging.INFO, "%s: closed (%s%s)", self.name,
                reason, extra)
        self.stream.close()
        self.close_child()
        if self.worker is not None:
            self.worker.cancel()
            self.worker = None
        self.queue.clear()
        for end in self.pending.values():
            end.close()
        self.pending.clear()
        self._board.forget(self)

    # --- what the broker sends ----------------------------------------------------------------

    def send_now(self, data: bytes) -> None:
        """A line for the job now (the hand-over's own answer: nothing is queued ahead)."""
        self.stream.send(data)

    def send_ok(self, conn: int, job_end: socket.socket, handle: int | None = None) -> None:
        """Hand ``job_end`` to the job as connection ``conn``; owned here until ``received``.
        ``handle``: the end was duplicated into the job already (Windows), named, not attached."""
        self.pending[conn] = job_end
        if handle is None:
            self.stream.send(wire.Ok(conn).line(), job_end)
        else:
            self.stream.send(wire.Ok(conn, handle).line())

    # --- lines from the job -------------------------------------------------------------------

    def _enqueue(self, item: wire.Connect | bytes) -> None:
        self.queue.append(item)
        if len(self.queue) >= CONNECTOR_MAX_QUEUED:
            # Back-pressure: the job's further lines wait in its own kernel buffer.
            self.stream.pause()

    def _refuse(self, code: str, detail: str) -> None:
        data = refusal(code, detail[:1000])
        if self.queue:
            self._enqueue(data)  # answered in order, after the connects before it
        else:
            self.stream.send(data)

    def _bad_request(self, detail: str) -> None:
        if self.bad_requests == 0:
            log.warning("%s: bad request: %s", self.name, detail)
        self.bad_requests += 1
        self._refuse("bad_request", detail)

    def _on_overlong(self, detail: str) -> None:
        # Nothing more is answered on a connector we are ending: the refusal goes out now,
        # ahead of anything queued, as far as the socket takes it.
        self.queue.clear()
        self._bad_request(f"{detail}; closing this connector")
        if not self.closed:
            self.stream.flush_and_close()
        self.close("a line over the wire cap")

    def _on_line(self, line: bytes) -> None:
        try:
            msg = wire.parse_line_from_job(line)
        except wire.WireError as exc:
            self._bad_request(exc.detail)
            return
        if isinstance(msg, wire.Received):
            end = self.pending.pop(msg.conn, None)
            if end is None:
                # A receipt for nothing we hold: harmless, so no answer (an answer here would
                # be read as the reply to the job's next connect). Logged once, then counted.
                if self.stray_receipts == 0:
                    log.warning(
                        "%s: 'received' for connection %d, which is not awaiting a receipt: ignored",
                        self.name,
                        msg.conn,
                    )
                self.stray_receipts += 1
            else:
                end.close()
            return
        verdict = decide(unreceived=len(self.pending), bucket=self.bucket, now=self._loop.time(),
                         queued=self.worker is not None or bool(self.queue),
                         ready_now=self._ready_now)
        if verdict.action == "refuse":
            assert verdict.code is not None and verdict.detail is not None
            self._refuse(verdict.code, verdict.detail)
            return
        if verdict.action == "hand_over":
            if self._board.hand_over(self, msg):
                return
            # ready_now said ready, but the service died on the way: this connect waits for
            # its next run, as one made while it restarts does (the worker tries once more)
            self._retried = msg
        self._enqueue(msg)
        if self.worker is None:
            self.worker = self._loop.create_task(self._work(), name=self.name)
            self._board.track(self.worker)

    # --- the worker: answers queued connects in order -----------------------------------------

    async def _work(self) -> None:
        try:
            while self.queue and not self.closed:
                item = self.queue[0]
                if isinstance(item, bytes):
                    self.queue.popleft()
                    self.stream.send(item)
                    continue
                ready = await self._board.wait_ready(self.service_key)
                if self.closed:
                    return
                self.queue.popleft()
                if ready and self._board.hand_over(self, item):
                    continue
                if ready and item is not self._retried:
                    # ready, then gone before the hand-over: wait once for the next run
                    self._retried = item
                    self.queue.appendleft(item)
                elif ready:
                    self.stream.send(refusal(
                        "service_unavailable",
                        f"service {self.service_key} has no open endpoint channel (it "
                        "stopped or is restarting); retry later",
                    ))
                else:
                    self.stream.send(refusal(
                        "service_unavailable",
                        f"service {self.service_key} is not running and ready: it did not "
                        "become ready within its start timeout, or it is held, withdrawn or "
                        "cannot start; retry later",
                    ))
        finally:
            if self.worker is asyncio.current_task():
                self.worker = None
            if not self.closed:
                self.stream.resume()
