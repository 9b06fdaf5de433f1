"""An endpoint channel: the agent's end of one run of one endpoint service (contract section 3).

Rules:

- The channel owns its agent end, and its child end until ``close_child_end`` (after the
  ``start`` op is spawned, or on failure). An end handed over in a ``connection`` is owned by
  the channel until the service's ``accepted`` arrives, then closed. Closing the channel closes
  everything it owns.
- The service's first line must be ``hello``, exactly once. EOF, a malformed line or a protocol
  violation from the service is a service failure: ``closed`` resolves with the reason. The
  agent closing a channel is silent (``closed`` stays unresolved).
- ``ready`` (the feature the agent offers in ``OARBANK_ENDPOINT_FEATURES``): at most once,
  after hello. It resolves ``ready_said`` and calls ``on_ready`` from the reader itself, so the
  supervisor can count the service ready in the same loop turn the line arrived in.

``Channels`` is the table of each service's current channel: the supervisor opens one per
start, the broker looks it up to hand connections over. Both are given the same table at
construction, so neither holds the other.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from oarbank_agent import platform
from oarbank_agent.broker.msgstream import MessageStream
from oarbank_sdk import advice
from oarbank_sdk.protocol import wire

__all__ = ["Channel", "Channels", "refusal", "CHANNEL_MAX_OUT", "FEATURES", "FEATURES_ENV"]

# The broker's log: channels, connectors and hand-overs read as one story.
log = logging.getLogger("oarbank_agent.broker.handover")

# Bytes the agent keeps for a service that does not read before it gives up on it.
CHANNEL_MAX_OUT = 1024 * 1024

# What the agent offers endpoint services: in the environment of their ops (so of their
# daemons), comma-separated (contract section 3).
FEATURES_ENV = "OARBANK_ENDPOINT_FEATURES"
FEATURES = ("ready",)


def refusal(code: str, detail: str) -> bytes:
    """A refusal line for a job (``service_unavailable``, ``rate_limited``, ...)."""
    return wire.Refusal(code, detail).line()


class Channel:
    """One run of one endpoint service: the agent's end of its endpoint channel.

    Wait on ``hello`` and ``closed`` together: if the service dies before its hello, only
    ``closed`` resolves. ``close()`` by the agent resolves neither.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, service_key: str, *,
                 kept: tuple[socket.socket, int, bool] | None = None) -> None:
        """``kept``: (our end, the hello's pid, whether it said ``ready``) of a channel kept
        across an agent restart (``oarbank_agent/keep``): open and hello'd already."""
        self.service_key = service_key
        if kept is None:
            # The child end goes to the service's `start` op (supervisor: transport.format
            # and the op's inherited handles); ours stays here.
            agent_end, child = platform.current().streams.child_pair()
        else:
            agent_end, child = kept[0], None
        self._child: socket.socket | None = child
        self.child_fd: int = child.fileno() if child is not None else -1
        self.agent_fd: int = agent_end.fileno()  # what --keep-services hands to the keeper
        self.hello: asyncio.Future[int] = loop.create_future()
        self.closed: asyncio.Future[str] = loop.create_future()
        # The service said `ready` on the channel; ``on_ready`` (the supervisor's) runs then.
        self.ready_said: asyncio.Future[None] = loop.create_future()
        if kept is not None:
            self.hello.set_result(kept[1])
            if kept[2]:
                self.ready_said.set_result(None)
        self.on_ready: Callable[[], None] | None = None
        # Whether a pid is one of the service's processes (its start op's group, set once the
        # op ran): where ends are duplicated into the hello's pid (Windows), it must be.
        self.owns: Callable[[int], bool] | None = None
        # conn -> (the service end we sent, its attempt's name), until `accepted`.
        self._pending: dict[int, tuple[socket.socket, str]] = {}
        self._stopping = False  # set by expect_close: the agent is stopping this service
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
        if kept is None:
            log.info("channel %s: opened (child end fd %d)", service_key, self.child_fd)
        else:
            log.info("channel %s: kept across the agent restart (hello from pid %d)",
                     service_key, kept[1])

    @property
    def is_open(self) -> bool:
        return not self._stream.closed

    @property
    def pending_ends(self) -> int:
        """Ends handed to the service that await its ``accepted``."""
        return len(self._pending)

    @property
    def holds_child_end(self) -> bool:
        return self._child is not None

    @property
    def usable(self) -> bool:
        """Open and the service said hello: connections may be handed to it."""
        return self.is_open and self.hello.done()

    def close_child_end(self) -> None:
        """Close the agent's copy of the child end (after spawning `start`, or on failure)."""
        if self._child is not None:
            self._child.close()
            self._child = None

    def expect_close(self) -> None:
        """The agent is stopping the service (its ``stop`` op runs): the service closing its
        end now is the stop working, logged at INFO, not a failure an operator must act on."""
        self._stopping = True

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
        # open -> closed by the service: the supervisor acts on `closed`. During a stop the
        # agent asked for, that is the service obeying (INFO); otherwise it failed (WARNING).
        if self._stopping:
            log.info("channel %s: closed by the service as it stops", self.service_key)
        else:
            log.warning("channel %s: %s", self.service_key, reason)
        self._shutdown()
        if not self.closed.done():
            self.closed.set_result(reason)

    def _on_broken(self, reason: str) -> None:
        if reason.startswith("peer closed its end"):
            how = reason[len("peer closed its end") :].strip()
            reason = advice.channel_closed(how or "end of file")  # conform's words
        elif "Connection reset by peer" in reason:
            # A unix stream whose peer closed with our messages unread reads as a reset, not
            # an end of file: the service closed its channel all the same (it died under a
            # `connection` or `ended` it had not read yet).
            reason = advice.channel_closed("reset: it closed with messages unread")
        elif "Broken pipe" in reason:
            # A send that finds the service's end closed: the same death, seen from the
            # writing side first (which side the loop sees first is the selector's order).
            reason = advice.channel_closed("broken pipe: it closed while the agent was sending")
        elif reason.startswith("peer is not reading"):
            reason = "the service is not reading its endpoint channel" + reason[len("peer is not reading") :]
        self._fail(reason)

    def _on_line(self, line: bytes) -> None:
        try:
            msg = wire.parse_line_from_service(line)
        except wire.WireError as exc:
            self._fail(f"protocol violation: {exc.detail}")
            return
        if isinstance(msg, wire.Hello):
            if self.hello.done():
                self._fail("protocol violation: a second 'hello'")
                return
            # open -> open and hello'd: connections may now flow to this service.
            log.info("channel %s: hello from pid %d", self.service_key, msg.pid)
            self.hello.set_result(msg.pid)
            return
        if not self.hello.done():
            what = "ready" if isinstance(msg, wire.Ready) else "accepted"
            self._fail(f"protocol violation: '{what}' before 'hello'")
            return
        if isinstance(msg, wire.Ready):
            self._on_ready()
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

    def _on_ready(self) -> None:
        if self.ready_said.done():
            self._fail("protocol violation: a second 'ready'")
            return
        # open and hello'd -> said ready: the agent stops polling the `ready` op.
        log.info("channel %s: ready (said on the channel)", self.service_key)
        self.ready_said.set_result(None)
        if self.on_ready is not None:
            self.on_ready()

    # --- what the broker sends ------------------------------------------------------------------

    def send_connection(self, conn: int, attempt_id: str, wire_id: int,
                        end: socket.socket, handle: int | None = None) -> bool:
        """Hand ``end`` to the service as connection ``conn`` of attempt ``wire_id``; the
        channel owns ``end`` until the service's ``accepted``. ``handle``: the end was
        duplicated into the service already (Windows), named, not attached. False if the
        channel broke meanwhile."""
        self._pending[conn] = (end, attempt_id)
        if handle is None:
            return self._stream.send(wire.Connection(conn, wire_id).line(), end)
        return self._stream.send(wire.Connection(conn, wire_id, handle).line())

    def send_ended(self, wire_id: int) -> None:
        """Tell the service the attempt ``wire_id`` is over."""
        self._stream.send(wire.Ended(wire_id).line())

    def drop_pending(self, attempt_id: str) -> None:
        """Close the ends of ``attempt_id`` still awaiting the service's receipt."""
        for conn in [c for c, (_s, a) in self._pending.items() if a == attempt_id]:
            self._pending.pop(conn)[0].close()


class Channels:
    """Each endpoint service's current channel (service key -> Channel)."""

    def __init__(self) -> None:
        self._by_key: dict[str, Channel] = {}

    def open(self, service_key: str) -> Channel:
        """A fresh channel for a new run of ``service_key``; closes that service's previous one."""
        old = self._by_key.pop(service_key, None)
        if old is not None:
            old.close()
        ch = Channel(asyncio.get_running_loop(), service_key)
        self._by_key[service_key] = ch
        return ch

    def adopt(self, service_key: str, end: socket.socket, pid: int, said_ready: bool) -> Channel:
        """The channel of a service kept across an agent restart, from our end of it."""
        old = self._by_key.pop(service_key, None)
        if old is not None:
            old.close()
        ch = Channel(asyncio.get_running_loop(), service_key, kept=(end, pid, said_ready))
        self._by_key[service_key] = ch
        return ch

    def get(self, service_key: str) -> Channel | None:
        return self._by_key.get(service_key)

    def all(self) -> list[Channel]:
        return list(self._by_key.values())

    def close_all(self) -> None:
        """Close every channel (silently)."""
        for ch in self._by_key.values():
            ch.close()
        self._by_key.clear()
