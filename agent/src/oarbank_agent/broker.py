"""The connection broker: jobs reach endpoint services, nothing listens (contract section 3).

Rules (the broker's state machine, written down once):

- Every descriptor has one owner. A ``Channel`` owns its agent end (and its child end until
  ``close_child_end``); a connector owns its agent end (and its child end until
  ``close_child_ends``); ends handed over in a ``connection``/``ok`` are owned by the channel or
  connector that sent them until the receipt (``accepted``/``received``) arrives, then closed.
  Closing a channel or connector closes everything it owns.
- A connector answers every line in order: ``connect`` -> ``ok`` or a refusal; ``received`` ->
  nothing. Malformed lines get ``bad_request``; a line over the cap gets ``bad_request`` and
  ends the connector. Rate limit per connector (burst, then a steady rate). A connect waits for
  the gate (a service (re)starting is waited for); one slow connector never delays another.
- A channel's first line must be ``hello``, exactly once. EOF, a malformed line or a protocol
  violation from the service is a service failure: ``closed`` resolves with the reason. The
  agent closing a channel is silent.
- ``end_attempt`` closes the attempt's connectors, sends ``ended`` to every still-open channel
  the attempt reached, and drops the attempt's ends still awaiting receipts.
- On the channel an attempt is a JSON integer (its wire id: positive, from one counter for the
  agent process, never reused), as the contract and the upstream SDK (which does
  ``int(msg["attempt"])``) want. The broker's callers name attempts by their job/attempt names;
  ``wire_attempt`` gives the number, and every log line about an attempt shows both. An agent
  restarted on the same state dir continues after the highest number its jobs recorded
  (``continue_wire_attempts_after``), so a number in ``status`` names one attempt only.

Everything runs on the agent's one asyncio loop; call the public methods from that loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from oarbank_sdk import _wire

from ._msgstream import MessageStream
from .ratelimit import TokenBucket

__all__ = ["ServiceGate", "Channel", "Broker"]

log = logging.getLogger("oarbank_agent.broker")

# Connection numbers are unique per agent process, across brokers and services.
_CONN_NUMBERS = itertools.count(1)


class _WireIds:
    """Attempt wire ids: unique for the agent's lifetime (across brokers), and past any number
    an earlier agent on the same state dir used."""

    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        self.last += 1
        return self.last

    def at_least(self, n: int) -> None:
        self.last = max(self.last, n)


_ATTEMPT_NUMBERS = _WireIds()

# Bytes the agent keeps for a peer that does not read before it gives up on that peer.
CONNECTOR_MAX_OUT = 256 * 1024
CHANNEL_MAX_OUT = 1024 * 1024
# Connects queued behind one that waits for its service: beyond this, stop reading the
# connector (the job's writes block in its own kernel buffer, not in our memory).
CONNECTOR_MAX_QUEUED = 64
# Ends handed to a job that has not confirmed them with `received`: beyond this the connector
# refuses connects (rate_limited) until the job confirms some.
CONNECTOR_MAX_UNRECEIVED = 256


class ServiceGate(Protocol):
    """Implemented by the agent's supervisor."""

    async def wait_ready(self, service_key: str) -> bool:
        """True once the service is ready (ready op true AND hello AND channel open); False if
        not ready within its start_timeout_s, or withdrawn / held / not startable. Never raises."""
        ...

    # Optional: ``def ready_now(self, service_key: str) -> bool``, a synchronous check that
    # answers True only when ``wait_ready`` would answer True at once. With it, a connect to a
    # ready service is handed over on the spot, without a task (the broker's hot path).


def _refusal(code: str, detail: str) -> bytes:
    return _wire.encode(_wire.Refusal(code, detail).to_wire())


def _pair() -> tuple[socket.socket, socket.socket]:
    # Python creates both ends close-on-exec and blocking; ends handed to peers stay blocking
    # (O_NONBLOCK is shared with every holder of the descriptor).
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


class Channel:
    """One run of one endpoint service: the agent's end of its endpoint channel.

    Wait on ``hello`` and ``closed`` together: if the service dies before its hello, only
    ``closed`` resolves. ``close()`` by the agent resolves neither.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, service_key: str) -> None:
        self.service_key = service_key
        agent_end, child = _pair()
        child.set_inheritable(True)
        self._child: socket.socket | None = child
        self.child_fd: int = child.fileno()
        self.hello: asyncio.Future[int] = loop.create_future()
        self.closed: asyncio.Future[str] = loop.create_future()
        # conn -> (the service end we sent, its attempt's name), until `accepted`.
        self._pending: dict[int, tuple[socket.socket, str]] = {}
        self._stream = MessageStream(
            loop,
            agent_end,
            name=f"channel {service_key}",
            on_line=self._on_line,
            on_overlong=lambda detail: self._fail(f"protocol violation: {detail}"),
            on_broken=self._on_broken,
            max_out=CHANNEL_MAX_OUT,
        )
        self._stream.start()
        log.info("channel %s: opened (child end fd %d)", service_key, self.child_fd)

    @property
    def is_open(self) -> bool:
        return not self._stream.closed

    @property
    def usable(self) -> bool:
        """Open and the service said hello: connections may be handed to it."""
        return self.is_open and self.hello.done()

    def close_child_end(self) -> None:
        """Close the agent's copy of the child end (after spawning `start`, or on failure)."""
        if self._child is not None:
            self._child.close()
            self._child = None

    def close(self) -> None:
        """The agent closes the channel: the service sees EOF. Does not resolve ``closed``."""
        if self.is_open:
            log.info("channel %s: closed by the agent", self.service_key)
        self._shutdown()

    # --- internals ----------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._stream.close()
        self.close_child_end()
        for sock, _attempt in self._pending.values():
            sock.close()
        self._pending.clear()

    def _fail(self, reason: str) -> None:
        """The service broke the channel (EOF or protocol violation): a service failure."""
        if not self.is_open:
            return
        # open -> closed by the service: the supervisor acts on `closed`.
        log.warning("channel %s: %s", self.service_key, reason)
        self._shutdown()
        if not self.closed.done():
            self.closed.set_result(reason)

    def _on_broken(self, reason: str) -> None:
        if reason.startswith("peer closed its end"):
            reason = "the service closed its endpoint channel" + reason[len("peer closed its end") :]
        elif reason.startswith("peer is not reading"):
            reason = "the service is not reading its endpoint channel" + reason[len("peer is not reading") :]
        self._fail(reason)

    def _on_line(self, line: bytes) -> None:
        try:
            msg = _wire.parse_from_service(_wire.decode(line))
        except _wire.WireError as exc:
            self._fail(f"protocol violation: {exc.detail}")
            return
        if isinstance(msg, _wire.Hello):
            if self.hello.done():
                self._fail("protocol violation: a second 'hello'")
                return
            # open -> open and hello'd: connections may now flow to this service.
            log.info("channel %s: hello from pid %d", self.service_key, msg.pid)
            self.hello.set_result(msg.pid)
            return
        if not self.hello.done():
            self._fail("protocol violation: 'accepted' before 'hello'")
            return
        entry = self._pending.pop(msg.conn, None)
        if entry is None:
            log.warning(
                "channel %s: 'accepted' for connection %d, which is not awaiting a receipt: ignored",
                self.service_key,
                msg.conn,
            )
            return
        entry[0].close()

    def _send_connection(self, conn: int, attempt_id: str, wire: int, end: socket.socket) -> bool:
        self._pending[conn] = (end, attempt_id)
        return self._stream.send(_wire.encode(_wire.Connection(conn, wire).to_wire()), end)

    def _send_ended(self, wire: int) -> None:
        self._stream.send(_wire.encode(_wire.Ended(wire).to_wire()))

    def _drop_pending(self, attempt_id: str) -> None:
        for conn in [c for c, (_s, a) in self._pending.items() if a == attempt_id]:
            self._pending.pop(conn)[0].close()


@dataclass
class _Attempt:
    wire: int  # the attempt's id on the channel
    connectors: dict[str, _Connector] = field(default_factory=dict)  # service key -> connector
    reached: dict[str, list[Channel]] = field(default_factory=dict)  # service key -> channels


class _Connector:
    """The agent's end of one (attempt, service) connector."""

    def __init__(
        self, broker: Broker, loop: asyncio.AbstractEventLoop, attempt_id: str, wire: int,
        service_key: str,
    ) -> None:
        self._broker = broker
        self._loop = loop
        self.attempt_id = attempt_id
        self.wire = wire
        self.service_key = service_key
        self.name = f"connector attempt={attempt_id} (wire {wire}) service={service_key}"
        agent_end, child = _pair()
        child.set_inheritable(True)
        self.child: socket.socket | None = child
        self.child_fd = child.fileno()
        self.bucket = TokenBucket(broker.rate_burst, broker.rate_per_s, loop.time())
        # Work answered in order: a Connect to hand over, or the bytes of a refusal decided
        # when its line arrived but queued behind a connect still waiting for its service.
        self.queue: deque[_wire.Connect | bytes] = deque()
        self.worker: asyncio.Task[None] | None = None
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
        self._broker._forget_connector(self)

    # --- lines from the job -------------------------------------------------------------------

    def _enqueue(self, item: _wire.Connect | bytes) -> None:
        self.queue.append(item)
        if len(self.queue) >= CONNECTOR_MAX_QUEUED:
            # Back-pressure: the job's further lines wait in its own kernel buffer.
            self.stream.pause()

    def _refuse(self, code: str, detail: str) -> None:
        data = _refusal(code, detail[:1000])
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
            msg = _wire.parse_from_job(_wire.decode(line))
        except _wire.WireError as exc:
            self._bad_request(exc.detail)
            return
        if isinstance(msg, _wire.Received):
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
        now = self._loop.time()
        if len(self.pending) >= CONNECTOR_MAX_UNRECEIVED:
            self._refuse(
                "rate_limited",
                f"{len(self.pending)} connections handed over await your 'received'; "
                "confirm them before connecting again",
            )
            return
        if not self.bucket.take(now):
            wait = self.bucket.retry_after(now)
            self._refuse(
                "rate_limited",
                f"over {self.bucket.burst} connects at once or {self.bucket.rate_per_s:g} a "
                f"second on this connector; retry in {wait:.3f} s",
            )
            return
        if self.worker is None and not self.queue and self._broker._ready_now(self.service_key):
            # Fast path: nothing queued ahead and the service is ready now: hand over in place
            # (a task and a wait_ready per connect cost ~27% of the agent's CPU per connect).
            self._broker._hand_over(self, msg)
            return
        self._enqueue(msg)
        if self.worker is None:
            self.worker = self._loop.create_task(self._work(), name=self.name)
            self._broker._tasks.add(self.worker)
            self.worker.add_done_callback(self._broker._tasks.discard)

    # --- the worker: answers queued connects in order -----------------------------------------

    async def _work(self) -> None:
        try:
            while self.queue and not self.closed:
                item = self.queue[0]
                if isinstance(item, bytes):
                    self.queue.popleft()
                    self.stream.send(item)
                    continue
                ready = await self._broker._wait_ready(self.service_key)
                if self.closed:
                    return
                self.queue.popleft()
                if ready:
                    self._broker._hand_over(self, item)
                else:
                    self.stream.send(_refusal(
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


class Broker:
    """Connectors for attempts, channels for endpoint services, and the hand-over between."""

    def __init__(self, gate: ServiceGate, *, rate_burst: int = 64, rate_per_s: float = 32.0):
        self._gate = gate
        self.rate_burst = rate_burst
        self.rate_per_s = rate_per_s
        self._channels: dict[str, Channel] = {}
        self._attempts: dict[str, _Attempt] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # --- services -----------------------------------------------------------------------------

    def open_channel(self, service_key: str) -> Channel:
        """A fresh channel for a new run of ``service_key``; closes that service's previous one."""
        old = self._channels.pop(service_key, None)
        if old is not None:
            old.close()
        ch = Channel(asyncio.get_running_loop(), service_key)
        self._channels[service_key] = ch
        return ch

    async def _wait_ready(self, service_key: str) -> bool:
        try:
            ready = await self._gate.wait_ready(service_key)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("gate.wait_ready(%r) raised; treating the service as unavailable", service_key)
            return False
        return bool(ready)

    def _ready_now(self, service_key: str) -> bool:
        ready_now = getattr(self._gate, "ready_now", None)
        if ready_now is None:
            return False  # a gate without the optional check: always the waited path
        try:
            return bool(ready_now(service_key))
        except Exception:
            log.exception("gate.ready_now(%r) raised; taking the waited path", service_key)
            return False

    # --- attempts -----------------------------------------------------------------------------

    def _attempt(self, attempt_id: str) -> _Attempt:
        attempt = self._attempts.get(attempt_id)
        if attempt is None:
            attempt = self._attempts[attempt_id] = _Attempt(_ATTEMPT_NUMBERS.next())
        return attempt

    def continue_wire_attempts_after(self, used: int) -> None:
        """Number the next attempts above ``used`` (the highest an earlier agent recorded)."""
        _ATTEMPT_NUMBERS.at_least(used)

    def wire_attempt(self, attempt_id: str) -> int:
        """The integer that names ``attempt_id`` on service channels (allotted on first use;
        the same until ``end_attempt``). Call ``end_attempt`` for every attempt named here."""
        return self._attempt(attempt_id).wire

    def open_connector(self, attempt_id: str, service_key: str) -> int:
        """The child end's descriptor (inheritable) for the runner of ``attempt_id``.

        Raises ValueError if this attempt already has an open connector to ``service_key``.
        """
        attempt = self._attempt(attempt_id)
        if service_key in attempt.connectors:
            raise ValueError(f"attempt {attempt_id!r} already has a connector to service {service_key!r}")
        conn = _Connector(self, asyncio.get_running_loop(), attempt_id, attempt.wire, service_key)
        attempt.connectors[service_key] = conn
        # Info, once per attempt and service: the line that maps a service's log (which sees
        # only the wire id) back to the job.
        log.info("%s: opened (child end fd %d)", conn.name, conn.child_fd)
        return conn.child_fd

    def close_child_ends(self, attempt_id: str) -> None:
        """Close the agent's copies of the attempt's child ends (runner spawned or failed)."""
        attempt = self._attempts.get(attempt_id)
        if attempt is not None:
            for conn in attempt.connectors.values():
                conn.close_child()

    def end_attempt(self, attempt_id: str) -> None:
        """Close the attempt's connectors and tell every service it reached that it is over."""
        attempt = self._attempts.pop(attempt_id, None)
        if attempt is None:
            return
        for conn in list(attempt.connectors.values()):
            conn.close("attempt ended")
        for channels in attempt.reached.values():
            for ch in channels:
                ch._drop_pending(attempt_id)
                if ch.is_open:
                    ch._send_ended(attempt.wire)
        log.debug(
            "attempt %s (wire %d): ended; services reached: %s",
            attempt_id,
            attempt.wire,
            ", ".join(sorted(attempt.reached)) or "none",
        )

    def reached(self, attempt_id: str) -> set[str]:
        """Service keys the attempt has connected to (empty once ``end_attempt`` ran)."""
        attempt = self._attempts.get(attempt_id)
        return set(attempt.reached) if attempt is not None else set()

    def _forget_connector(self, conn: _Connector) -> None:
        # The attempt record stays until end_attempt: it remembers the services reached.
        attempt = self._attempts.get(conn.attempt_id)
        if attempt is not None and attempt.connectors.get(conn.service_key) is conn:
            del attempt.connectors[conn.service_key]

    # --- the hand-over ------------------------------------------------------------------------

    def _hand_over(self, conn: _Connector, connect: _wire.Connect) -> None:
        ch = self._channels.get(conn.service_key)
        if ch is None or not ch.usable:
            conn.stream.send(_refusal(
                "service_unavailable",
                f"service {conn.service_key} has no open endpoint channel (it stopped or is "
                "restarting); retry later",
            ))
            return
        number = next(_CONN_NUMBERS)
        service_end, job_end = _pair()
        attempt = self._attempts.get(conn.attempt_id)
        if attempt is not None:
            reached = attempt.reached.setdefault(conn.service_key, [])
            if ch not in reached:
                reached.append(ch)
        if not ch._send_connection(number, conn.attempt_id, conn.wire, service_end):
            job_end.close()
            conn.stream.send(_refusal(
                "service_unavailable",
                f"service {conn.service_key} failed while taking the connection; retry later",
            ))
            return
        conn.pending[number] = job_end
        conn.stream.send(_wire.encode(_wire.Ok(number).to_wire()), job_end)
        log.debug("%s: connection %d for pid %d", conn.name, number, connect.pid)

    # --- introspection and shutdown -----------------------------------------------------------

    def stats(self) -> dict[str, int]:
        connectors = [c for a in self._attempts.values() for c in a.connectors.values()]
        channels = [c for c in self._channels.values() if c.is_open]
        return {
            "channels": len(channels),
            "connectors": len(connectors),
            "pending_ends": sum(len(c.pending) for c in connectors) + sum(len(c._pending) for c in channels),
            "child_ends": sum(c.child is not None for c in connectors)
            + sum(c._child is not None for c in self._channels.values()),
            "attempts": len(self._attempts),
            "queued_connects": sum(len(c.queue) for c in connectors),
        }

    async def aclose(self) -> None:
        """Close every connector and channel (silently) and wait for the connect workers."""
        for attempt_id in list(self._attempts):
            attempt = self._attempts.pop(attempt_id)
            for conn in list(attempt.connectors.values()):
                conn.close("broker closed")
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
