"""The connection broker: jobs reach endpoint services, nothing listens (contract section 3).

Three parts, one module each:

- ``channel.py``: a service's endpoint channel (``hello``, ``connection``/``accepted``,
  ``ended``) and ``Channels``, the table of each service's current one.
- ``connector.py``: an attempt's connector to one service (``connect``/``ok``/``received``),
  with the pure ``decide`` for each connect (unreceived cap, rate limit, hand over or queue).
- this module: the ``Broker``, which owns the attempts' connectors and does the hand-over.

Rules (the broker's, written down once):

- Every descriptor has one owner. A channel owns its agent end (and its child end until
  ``close_child_end``); a connector owns its agent end (and its child end until
  ``close_child_ends``); ends handed over in a ``connection``/``ok`` are owned by the channel or
  connector that sent them until the receipt (``accepted``/``received``) arrives, then closed.
  Closing a channel or connector closes everything it owns.
- The hand-over: a new socketpair per ``connect``; one end to the service (``connection``),
  the other to the job (``ok``). A service with no usable channel (stopped, restarting, never
  said hello) is ``service_unavailable``. A connect waits for the gate (``ServiceGate``: a
  service (re)starting is waited for); one slow connector never delays another.
- ``end_attempt`` closes the attempt's connectors, sends ``ended`` to every still-open channel
  the attempt reached, and drops the attempt's ends still awaiting receipts.
- On the channel an attempt is a JSON integer (its wire id: positive, from one counter for the
  agent process, never reused), as the contract and the upstream SDK (which does
  ``int(msg["attempt"])``) want. The broker's callers name attempts by their job/attempt names;
  ``wire_attempt`` gives the number, and every log line about an attempt shows both. An agent
  restarted on the same state dir continues after the highest number its jobs recorded
  (``continue_wire_attempts_after``), so a number in ``status`` names one attempt only.

The broker is given the gate and the channel table at construction; nothing holds the broker
back (connectors reach it through the ``Switchboard`` protocol). Everything runs on the agent's
one asyncio loop; call the public methods from that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from oarbank_agent import platform
from oarbank_agent.broker.channel import Channel, Channels, refusal
from oarbank_agent.broker.connector import Connector
from oarbank_sdk.protocol import current_transport, wire

__all__ = ["ServiceGate", "Channel", "Broker"]

log = logging.getLogger("oarbank_agent.broker.handover")

# Pairs for the hand-over (one per connect: made once, not looked up on the hot path).
_TRANSPORT = current_transport()

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


class ServiceGate(Protocol):
    """Implemented by the agent's supervisor."""

    async def wait_ready(self, service_key: str) -> bool:
        """True once the service is ready (ready op true AND hello AND channel open); False if
        not ready within its start_timeout_s, or withdrawn / held / not startable. Never raises."""
        ...

    # Optional: ``def ready_now(self, service_key: str) -> bool``, a synchronous check that
    # answers True only when ``wait_ready`` would answer True at once. With it, a connect to a
    # ready service is handed over on the spot, without a task (the broker's hot path).


@dataclass
class _Attempt:
    wire: int  # the attempt's id on the channel
    connectors: dict[str, Connector] = field(default_factory=dict)  # service key -> connector
    reached: dict[str, list[Channel]] = field(default_factory=dict)  # service key -> channels
    # Whether a pid is one of the attempt's processes (its runner's group, once it runs):
    # where ends are duplicated into the connect's pid (Windows), it must be (else bad_pid).
    owns: Callable[[int], bool] | None = None


class Broker:
    """Connectors for attempts, channels for endpoint services, and the hand-over between."""

    def __init__(self, gate: ServiceGate, *, channels: Channels | None = None,
                 rate_burst: int = 64, rate_per_s: float = 32.0):
        self._gate = gate
        # The gate's optional synchronous check, looked up once (it is asked on every connect).
        self._gate_ready_now = getattr(gate, "ready_now", None)
        self.rate_burst = rate_burst
        self.rate_per_s = rate_per_s
        # The channel table the supervisor opens channels in (its own one when none is given).
        self.channels = channels if channels is not None else Channels()
        self._attempts: dict[str, _Attempt] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # None: the ends ride along the messages (POSIX); else each is duplicated (Windows).
        self._handovers = platform.current().handovers
        # Called by end_attempt with the service keys the attempt reached (the agent reaps
        # their owned objects then: services/ownedwatch.py).
        self.on_attempt_end: Callable[[set[str]], None] | None = None

    # --- services -----------------------------------------------------------------------------

    def open_channel(self, service_key: str) -> Channel:
        """A fresh channel for a new run of ``service_key``; closes that service's previous one."""
        return self.channels.open(service_key)

    # --- the connectors' switchboard (connector.Switchboard) ---------------------------------

    async def wait_ready(self, service_key: str) -> bool:
        try:
            ready = await self._gate.wait_ready(service_key)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("gate.wait_ready(%r) raised; treating the service as unavailable", service_key)
            return False
        return bool(ready)

    def ready_now(self, service_key: str) -> bool:
        ready_now = self._gate_ready_now
        if ready_now is None:
            return False  # a gate without the optional check: always the waited path
        try:
            return bool(ready_now(service_key))
        except Exception:
            log.exception("gate.ready_now(%r) raised; taking the waited path", service_key)
            return False

    def track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, conn: Connector) -> None:
        # The attempt record stays until end_attempt: it remembers the services reached.
        attempt = self._attempts.get(conn.attempt_id)
        if attempt is not None and attempt.connectors.get(conn.service_key) is conn:
            del attempt.connectors[conn.service_key]

    # --- attempts -----------------------------------------------------------------------------

    def _attempt(self, attempt_id: str) -> _Attempt:
        attempt = self._attempts.get(attempt_id)
        if attempt is None:
            attempt = self._attempts[attempt_id] = _Attempt(_ATTEMPT_NUMBERS.next())
        return attempt

    def continue_wire_attempts_after(self, used: int) -> None:
        """Number the next attempts above ``used`` (the highest an earlier agent recorded)."""
        _ATTEMPT_NUMBERS.at_least(used)

    def wire_attempts(self) -> tuple[set[int], int]:
        """(the wire numbers of the attempts not ended yet, the highest number given so far):
        an owned object of an attempt between them is over (ownedwatch.py)."""
        return {a.wire for a in self._attempts.values()}, _ATTEMPT_NUMBERS.last

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
        conn = Connector(self, asyncio.get_running_loop(), attempt_id, attempt.wire, service_key,
                         rate_burst=self.rate_burst, rate_per_s=self.rate_per_s)
        attempt.connectors[service_key] = conn
        # Info, once per attempt and service: the line that maps a service's log (which sees
        # only the wire id) back to the job.
        log.info("%s: opened (child end fd %d)", conn.name, conn.child_fd)
        return conn.child_fd

    @contextlib.contextmanager
    def attempt(self, attempt_id: str) -> Iterator[str]:
        """One attempt's broker lifetime, as a ``with`` block: connectors are opened inside it
        (``open_connector``), their child ends closed once the runner holds them
        (``close_child_ends``); on leaving it, whatever happened inside (a return, an error, a
        cancellation), the child ends still held are closed and the attempt is ended
        (``end_attempt``: its connectors closed, ``ended`` to every service it reached).
        Yields ``attempt_id``."""
        try:
            yield attempt_id
        finally:
            self.close_child_ends(attempt_id)  # a connector opened, the runner never ran
            self.end_attempt(attempt_id)

    def own(self, attempt_id: str, owns: Callable[[int], bool]) -> None:
        """The attempt's runner runs: ``owns(pid)`` says whether a pid is one of its processes
        (asked of every connect where ends are duplicated into the connect's pid)."""
        attempt = self._attempts.get(attempt_id)
        if attempt is not None:
            attempt.owns = owns

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
                ch.drop_pending(attempt_id)
                if ch.is_open:
                    ch.send_ended(attempt.wire)
        if self.on_attempt_end is not None:
            self.on_attempt_end(set(attempt.reached))
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

    # --- the hand-over ------------------------------------------------------------------------

    def hand_over(self, conn: Connector, connect: wire.Connect) -> bool:
        ch = self.channels.get(conn.service_key)
        if ch is None or not ch.usable:
            return False  # the connector waits for the service's next run (or refuses)
        attempt = self._attempts.get(conn.attempt_id)
        number = next(_CONN_NUMBERS)
        if self._handovers is None:  # POSIX: the ends ride along the two messages
            service_end, job_end = _TRANSPORT.pair()
            job_handle = service_handle = None
        else:
            made = self._duplicated(conn, connect, ch, attempt)
            if made is None:
                return True  # refused (and answered) there
            job_end, service_end, job_handle, service_handle = made
        if attempt is not None:
            reached = attempt.reached.setdefault(conn.service_key, [])
            if ch not in reached:
                reached.append(ch)
        if not ch.send_connection(number, conn.attempt_id, conn.wire, service_end,
                                  service_handle):
            # The service died between its readiness and this send (the channel is closed
            # now, so it is not ready): nothing went to the job; the connector waits.
            job_end.close()
            return False
        conn.send_ok(number, job_end, job_handle)
        log.debug("%s: connection %d for pid %d", conn.name, number, connect.pid)
        return True

    def _duplicated(self, conn: Connector, connect: wire.Connect, ch: Channel,
                    attempt: _Attempt | None) -> tuple[Any, Any, int, int] | None:
        """Windows: a connection whose ends are duplicated into the connect's pid and the
        hello's pid, each checked to be a process of the attempt and of the service first;
        None once a refusal was sent."""
        assert self._handovers is not None
        if attempt is None or attempt.owns is None or not attempt.owns(connect.pid):
            conn.send_now(refusal(
                "bad_pid", f"pid {connect.pid} is not a process of this attempt (its job "
                "object): a connection goes only to a process of the attempt"))
            return None
        service_pid = ch.hello.result()
        if ch.owns is None or not ch.owns(service_pid):
            conn.send_now(refusal(
                "service_unavailable",
                f"service {conn.service_key} said hello from pid {service_pid}, which is not "
                "one of its processes: no connection is handed to it"))
            return None
        try:
            return self._handovers.duplicate(connect.pid, service_pid)
        except OSError as exc:
            conn.send_now(refusal(
                "service_unavailable",
                f"the connection could not be handed over ({exc}); retry later"))
            return None

    # --- introspection and shutdown -----------------------------------------------------------

    def stats(self) -> dict[str, int]:
        connectors = [c for a in self._attempts.values() for c in a.connectors.values()]
        channels = [c for c in self.channels.all() if c.is_open]
        return {
            "channels": len(channels),
            "connectors": len(connectors),
            "pending_ends": sum(len(c.pending) for c in connectors)
            + sum(c.pending_ends for c in channels),
            "child_ends": sum(c.child is not None for c in connectors)
            + sum(c.holds_child_end for c in self.channels.all()),
            "attempts": len(self._attempts),
            "queued_connects": sum(len(c.queue) for c in connectors),
        }

    async def aclose(self) -> None:
        """Close every connector and channel (silently) and wait for the connect workers."""
        for attempt_id in list(self._attempts):
            attempt = self._attempts.pop(attempt_id)
            for conn in list(attempt.connectors.values()):
                conn.close("broker closed")
        self.channels.close_all()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
