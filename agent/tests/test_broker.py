"""The broker with real socketpairs, real descriptors and (where it matters) real processes.

The only stand-in is ``Gate``, a ServiceGate whose readiness the test sets by hand: the real
one is the agent's supervisor, which is tested on its own. Peers inside the test process use
blocking sockets driven from worker threads (``asyncio.to_thread``) so the broker's loop keeps
running while a peer waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from oarbank_agent.broker.handover import Broker
from oarbank_sdk.protocol import current_transport, wire

T = current_transport()
PEERS = Path(__file__).with_name("broker_peers.py")
TIMEOUT = 10.0


def open_fds() -> int:
    """This process's descriptors (psutil: the same under the darwin profile and on a Mac)."""
    return int(psutil.Process().num_fds())


class Gate:
    """Test stand-in for the supervisor: readiness per service key, set by the test.

    True = ready, False = unavailable, None = starting (wait_ready waits until it changes).
    """

    def __init__(self, **states: bool | None) -> None:
        self.states: dict[str, bool | None] = {k.replace("__", "/"): v for k, v in states.items()}
        self._changed = asyncio.Event()
        self.calls = 0

    def set(self, key: str, state: bool | None) -> None:
        self.states[key] = state
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_ready(self, service_key: str) -> bool:
        self.calls += 1
        while self.states.get(service_key, False) is None:
            await self._changed.wait()
        return bool(self.states.get(service_key, False))


class Peer:
    """A blocking test-side peer on a dup of a child end (as a spawned process would hold)."""

    def __init__(self, fd: int) -> None:
        self.sock = T.open_stream(os.dup(fd))
        self.sock.settimeout(TIMEOUT)
        self.split = wire.LineSplitter()
        self.lines: list[bytes] = []
        self.fds: list[int] = []

    def send(self, msg: dict | bytes, attach: int | None = None) -> None:
        data = msg if isinstance(msg, bytes) else wire.encode(msg)
        sent = T.send(self.sock, data, attach=attach)
        self.sock.sendall(data[sent:])

    def read(self) -> tuple[dict | None, list[int]]:
        """Next message and the descriptors that came with it; (None, []) on EOF."""
        while not self.lines:
            data, fds = T.recv(self.sock, 65536)
            self.fds.extend(fds)
            if not data:
                return None, []
            self.lines.extend(self.split.feed(data))
        msg = wire.decode(self.lines.pop(0))
        fds, self.fds = self.fds, []
        return msg, fds

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.sock.close()


def job_connect(job: Peer, pid: int = 4242) -> tuple[dict, socket.socket | None]:
    """One connect: the reply and, on ok, the job's end (after sending `received`)."""
    job.send({"op": "connect", "pid": pid})
    msg, fds = job.read()
    assert msg is not None, "connector closed instead of answering"
    if not msg.get("ok"):
        assert fds == []
        return msg, None
    assert len(fds) == 1, msg
    job.send({"op": "received", "conn": msg["conn"]})
    end = socket.socket(fileno=fds[0])
    end.settimeout(TIMEOUT)
    return msg, end


def service_accept(svc: Peer) -> tuple[dict, socket.socket]:
    msg, fds = svc.read()
    assert msg is not None and msg["op"] == "connection", msg
    assert len(fds) == 1
    svc.send({"op": "accepted", "conn": msg["conn"]})
    end = socket.socket(fileno=fds[0])
    end.settimeout(TIMEOUT)
    return msg, end


def run(coro_fn, *args):
    """Run a scenario on a fresh loop; any exception the loop swallowed fails the test."""
    errors: list[dict] = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda _l, ctx: errors.append(ctx))
        return await asyncio.wait_for(coro_fn(*args), 120)

    result = asyncio.run(main())
    assert errors == [], errors
    return result


async def until(pred, what: str, timeout: float = TIMEOUT) -> None:
    """Wait (letting the broker's loop run) until ``pred()`` holds; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def ready_service(broker: Broker, key: str) -> tuple[object, Peer]:
    ch = broker.open_channel(key)
    svc = Peer(ch.child_fd)
    ch.close_child_end()
    svc.send({"op": "hello", "pid": os.getpid()})
    assert await asyncio.wait_for(ch.hello, TIMEOUT) == os.getpid()
    return ch, svc


@contextlib.asynccontextmanager
async def accepting_everything(svc: Peer):
    """The service's side for tests that only load the job side: a thread takes every handed
    connection (closing it, answering `accepted`) until the block ends or the channel closes."""
    stop = threading.Event()

    def accept_all() -> None:
        svc.sock.settimeout(0.2)
        while not stop.is_set():
            try:
                msg, fds = svc.read()
            except TimeoutError:
                continue
            if msg is None:
                return
            for fd in fds:
                os.close(fd)
            if msg["op"] == "connection":
                svc.send({"op": "accepted", "conn": msg["conn"]})

    acceptor = asyncio.create_task(asyncio.to_thread(accept_all))
    try:
        yield
    finally:
        stop.set()
        await acceptor


def job_peer(broker: Broker, attempt: str, key: str) -> Peer:
    fd = broker.open_connector(attempt, key)
    assert os.get_inheritable(fd)
    peer = Peer(fd)
    broker.close_child_ends(attempt)
    return peer


def assert_drained(broker: Broker) -> None:
    stats = broker.stats()
    assert stats["pending_ends"] == 0, stats
    assert stats["child_ends"] == 0, stats
    assert stats["queued_connects"] == 0, stats


# --- the handshake, end to end ------------------------------------------------------------


def test_job_and_service_processes_talk_through_handed_over_pairs():
    async def scenario():
        base = open_fds()
        gate = Gate(mod__svc=True)
        broker = Broker(gate)
        ch = broker.open_channel("mod/svc")
        svc = subprocess.Popen(
            [sys.executable, str(PEERS), "service", f"fd:{ch.child_fd}"],
            pass_fds=(ch.child_fd,),
            stdout=subprocess.PIPE,
            start_new_session=True,
            text=True,
        )
        job = None
        try:
            ch.close_child_end()
            assert await asyncio.wait_for(ch.hello, TIMEOUT) == svc.pid
            fd = broker.open_connector("att-1", "mod/svc")
            job = subprocess.Popen(
                [sys.executable, str(PEERS), "job", f"fd:{fd}", "3"],
                pass_fds=(fd,),
                stdout=subprocess.PIPE,
                start_new_session=True,
                text=True,
            )
            broker.close_child_ends("att-1")
            out, _ = await asyncio.to_thread(job.communicate, timeout=TIMEOUT)
            assert job.returncode == 0, out
            assert out.splitlines() == ["PING 0", "PING 1", "PING 2"]
            assert broker.reached("att-1") == {"mod/svc"}
            # Both receipts arrived: the agent holds no copy of any end it handed over.
            await until(lambda: broker.stats()["pending_ends"] == 0, "both receipts")
            assert_drained(broker)
            wire_id = broker.wire_attempt("att-1")
            broker.end_attempt("att-1")
            assert broker.stats()["connectors"] == 0
            line = await asyncio.to_thread(svc.stdout.readline)
            assert line == f"ended {wire_id}\n"
            # Stop order step 2: the agent closes the channel, the service sees EOF and exits.
            ch.close()
            rest, _ = await asyncio.to_thread(svc.communicate, timeout=TIMEOUT)
            assert svc.returncode == 0
            assert rest == ""
            assert not ch.closed.done(), "an agent-side close must not read as a failure"
            await broker.aclose()
            assert open_fds() == base  # communicate() closed both stdout pipes
        finally:
            for p in (svc, job):
                if p is not None and p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                if p is not None and p.stdout:
                    p.stdout.close()
        assert open_fds() == base

    run(scenario)


def test_receipts_close_the_agent_copies_and_bytes_flow_both_ways():
    async def scenario():
        base = open_fds()
        broker = Broker(Gate(m__s=True))
        ch, svc = await ready_service(broker, "m/s")
        job = job_peer(broker, "a1", "m/s")
        assert open_fds() == base + 4  # agent's channel + connector ends, two test peers

        job.send({"op": "connect", "pid": 7})
        reply, fds = await asyncio.to_thread(job.read)
        assert reply["ok"] is True and isinstance(reply["conn"], int) and len(fds) == 1
        conn_msg, sfds = await asyncio.to_thread(svc.read)
        # The attempt travels as its integer wire id (contract section 3), not its name.
        wire_id = broker.wire_attempt("a1")
        assert isinstance(wire_id, int) and not isinstance(wire_id, bool) and wire_id > 0
        assert conn_msg == {"op": "connection", "conn": reply["conn"], "attempt": wire_id}
        assert len(sfds) == 1
        # Before any receipt the agent still holds its copy of both ends.
        assert broker.stats()["pending_ends"] == 2
        assert open_fds() == base + 4 + 2 + 2

        job.send({"op": "received", "conn": reply["conn"]})
        svc.send({"op": "accepted", "conn": reply["conn"]})
        await until(lambda: broker.stats()["pending_ends"] == 0, "both receipts")
        assert open_fds() == base + 4 + 2  # only the peers' ends remain

        a = socket.socket(fileno=fds[0])
        b = socket.socket(fileno=sfds[0])
        with a, b:
            a.sendall(b"from the job")
            assert b.recv(100) == b"from the job"
            b.sendall(b"from the service")
            assert a.recv(100) == b"from the service"
            b.close()
            assert a.recv(100) == b"", "no other copy of the service end may remain"

        # A receipt repeated or for a connection never sent is ignored, and the connector lives.
        job.send({"op": "received", "conn": reply["conn"]})
        job.send({"op": "received", "conn": 999_999_999})
        svc.send({"op": "accepted", "conn": 999_999_999})
        msg, end = await asyncio.to_thread(job_connect, job)
        assert msg["ok"] is True and msg["conn"] > reply["conn"]
        _, send_ = await asyncio.to_thread(service_accept, svc)
        end.close()
        send_.close()
        assert ch.is_open and not ch.closed.done()

        broker.end_attempt("a1")
        await broker.aclose()
        job.close()
        svc.close()
        assert open_fds() == base

    run(scenario)


def test_connection_numbers_are_unique_across_brokers():
    async def scenario():
        seen = []
        for _ in range(2):
            broker = Broker(Gate(m__s=True))
            _ch, svc = await ready_service(broker, "m/s")
            job = job_peer(broker, "a", "m/s")
            for _ in range(3):
                msg, end = await asyncio.to_thread(job_connect, job)
                seen.append(msg["conn"])
                end.close()
                (await asyncio.to_thread(service_accept, svc))[1].close()
            await broker.aclose()
            job.close()
            svc.close()
        assert len(set(seen)) == 6

    run(scenario)


# --- refusals ---------------------------------------------------------------------------


def test_malformed_lines_and_unknown_ops_get_bad_request_and_the_connector_keeps_working():
    cases = [
        (b'{"op":"launch","pid":1}\n', "unknown op 'launch'"),
        (b"[1,2,3]\n", "must be a JSON object"),
        (b"\xff\xfe not utf-8\n", "not valid UTF-8"),
        (b"not json\n", "not JSON"),
        (b'{"op":"connect"}\n', "missing field 'pid'"),
        (b'{"op":"connect","pid":"12"}\n', "'pid' must be an integer"),
        (b'{"op":"received","conn":true}\n', "'conn' must be an integer"),
        (b'{"pid":1}\n', "no 'op' field"),
    ]

    async def scenario():
        broker = Broker(Gate(m__s=True))
        _ch, svc = await ready_service(broker, "m/s")
        job = job_peer(broker, "a", "m/s")
        for line, needle in cases:
            job.send(line)
            msg, fds = await asyncio.to_thread(job.read)
            assert msg is not None and fds == []
            assert msg["ok"] is False and msg["error"] == "bad_request", msg
            assert needle in msg["detail"], (needle, msg)
        msg, end = await asyncio.to_thread(job_connect, job)
        assert msg["ok"] is True
        end.close()
        (await asyncio.to_thread(service_accept, svc))[1].close()
        await broker.aclose()
        job.close()
        svc.close()

    run(scenario)


def test_a_line_over_the_cap_is_refused_and_ends_that_connector_only():
    async def scenario():
        broker = Broker(Gate(m__s=True))
        _ch, svc = await ready_service(broker, "m/s")
        bad = job_peer(broker, "a", "m/s")
        good = job_peer(broker, "b", "m/s")
        bad.send(b'{"op":"connect","pid":1,"pad":"' + b"x" * 5000)
        msg, _ = await asyncio.to_thread(bad.read)
        assert msg["error"] == "bad_request" and "4096" in msg["detail"], msg
        assert await asyncio.to_thread(bad.read) == (None, [])  # EOF: the connector is gone
        assert broker.stats()["connectors"] == 1
        msg, end = await asyncio.to_thread(job_connect, good)
        assert msg["ok"] is True
        end.close()
        (await asyncio.to_thread(service_accept, svc))[1].close()
        await broker.aclose()
        for p in (bad, good, svc):
            p.close()

    run(scenario)


def test_rate_limit_burst_of_64_then_about_32_a_second():
    async def scenario():
        broker = Broker(Gate(m__s=True))
        _ch, svc = await ready_service(broker, "m/s")
        job = job_peer(broker, "a", "m/s")
        async with accepting_everything(svc):
            # 64 at once, then many more: beyond the burst only what the rate refilled while
            # they were answered gets through (a loaded machine answers more slowly).
            n = 264

            def burst():
                began = time.monotonic()
                job.send(wire.encode({"op": "connect", "pid": 1}) * n)
                replies = []
                for _ in range(n):
                    msg, fds = job.read()
                    for fd in fds:
                        os.close(fd)
                    if msg.get("ok"):
                        job.send({"op": "received", "conn": msg["conn"]})
                    replies.append(msg)
                return replies, time.monotonic() - began

            replies, took = await asyncio.to_thread(burst)
            assert all(r["ok"] for r in replies[:64]), replies[:64]
            refused = [r for r in replies if not r["ok"]]
            assert refused and all(r["error"] == "rate_limited" and "retry in" in r["detail"]
                                   for r in refused), refused[:3]
            assert n - len(refused) <= 64 + 32 * took + 1, (n - len(refused), took)

            def steady(seconds: float) -> tuple[int, float]:
                ok = 0
                start = time.monotonic()
                while time.monotonic() - start < seconds:
                    msg, end = job_connect(job)
                    if end is not None:
                        end.close()
                        ok += 1
                    time.sleep(0.004)
                return ok, time.monotonic() - start

            ok, elapsed = await asyncio.to_thread(steady, 1.0)
            # Refilled at 32/s: about 32 in a second, loose bounds for a shared machine.
            assert 20 <= ok <= 32 * elapsed + 8, (ok, elapsed)
        await broker.aclose()
        job.close()
        svc.close()

    run(scenario)


def test_service_unavailable_and_connects_wait_while_a_service_starts():
    async def scenario():
        gate = Gate(m__down=False, m__slow=None, m__fast=True)
        broker = Broker(gate)
        down = job_peer(broker, "a", "m/down")
        msg, _ = await asyncio.to_thread(job_connect, down)
        assert msg["ok"] is False and msg["error"] == "service_unavailable"
        assert "m/down" in msg["detail"] and "retry" in msg["detail"]

        # m/slow is starting: its connect waits; a connector to another service is not held up.
        _ch_fast, svc_fast = await ready_service(broker, "m/fast")
        slow = job_peer(broker, "a", "m/slow")
        fast = job_peer(broker, "b", "m/fast")
        slow.send({"op": "connect", "pid": 1})
        slow.send(b"garbage behind the waiting connect\n")
        await until(lambda: broker.stats()["queued_connects"] == 2,
                    "the slow connect and the refusal behind it queued")
        msg, end = await asyncio.to_thread(job_connect, fast)
        assert msg["ok"] is True
        end.close()
        (await asyncio.to_thread(service_accept, svc_fast))[1].close()
        assert broker.stats()["queued_connects"] == 2  # the connect and the refusal behind it

        ch_slow, svc_slow = await ready_service(broker, "m/slow")
        gate.set("m/slow", True)
        msg, fds = await asyncio.to_thread(slow.read)
        assert msg["ok"] is True and len(fds) == 1  # answered in order: first the connect
        os.close(fds[0])
        msg, _ = await asyncio.to_thread(slow.read)
        assert msg["error"] == "bad_request"
        slow.send({"op": "received", "conn": 0})  # a stray receipt: ignored
        (await asyncio.to_thread(service_accept, svc_slow))[1].close()

        # The gate says ready but the channel is gone: refused, not handed to nobody.
        ch_slow.close()
        msg, _ = await asyncio.to_thread(job_connect, slow)
        assert msg["error"] == "service_unavailable" and "channel" in msg["detail"]

        await broker.aclose()
        for p in (down, slow, fast, svc_fast, svc_slow):
            p.close()

    run(scenario)


def test_connects_queued_behind_a_starting_service_stay_bounded():
    async def scenario():
        gate = Gate(m__s=None, m__t=True)
        broker = Broker(gate)
        job = job_peer(broker, "a", "m/s")

        def pipeline(n: int) -> None:
            job.send(wire.encode({"op": "connect", "pid": 1}) * n)

        # 1,000 connects while the service starts: the broker queues at most 64 and leaves the
        # rest unread in the socket (back-pressure), instead of growing its own memory.
        began = time.monotonic()
        writer = asyncio.create_task(asyncio.to_thread(pipeline, 1000))
        await until(lambda: broker.stats()["queued_connects"] >= 64, "64 connects queued")
        # The window: a whole connect of another attempt to a ready service, through the same
        # loop, while the rest lies readable on the first connector: a broker reading on would
        # have queued more meanwhile.
        _ch_t, svc_t = await ready_service(broker, "m/t")
        other = job_peer(broker, "b", "m/t")
        msg, end = await asyncio.to_thread(job_connect, other)
        assert msg["ok"] is True, msg
        end.close()
        (await asyncio.to_thread(service_accept, svc_t))[1].close()
        assert broker.stats()["queued_connects"] == 64
        _ch, svc = await ready_service(broker, "m/s")
        gate.set("m/s", True)
        await writer

        def read_all() -> list[dict]:
            replies = []
            for _ in range(1000):
                msg, fds = job.read()
                for fd in fds:
                    os.close(fd)
                replies.append(msg)
            return replies

        replies = await asyncio.to_thread(read_all)
        assert all(r["ok"] for r in replies[:64])
        assert {r.get("error") for r in replies[64:]} <= {"rate_limited", None}
        # Beyond the burst (64), only what the rate (32/s) refilled while this ran got through:
        # a bound by the clock, not a fixed count (a loaded machine takes longer).
        elapsed = time.monotonic() - began
        assert sum(1 for r in replies if r["ok"]) <= 64 + 32 * elapsed + 1
        await broker.aclose()
        for p in (job, svc, other, svc_t):
            p.close()

    run(scenario)


def test_gate_answering_false_after_a_wait_refuses():
    async def scenario():
        gate = Gate(m__s=None)
        broker = Broker(gate)
        job = job_peer(broker, "a", "m/s")
        job.send({"op": "connect", "pid": 1})
        await until(lambda: gate.calls == 1, "the connect waiting on the gate")
        gate.set("m/s", False)  # e.g. not ready within start_timeout_s
        msg, _ = await asyncio.to_thread(job.read)
        assert msg["error"] == "service_unavailable"
        await broker.aclose()
        job.close()

    run(scenario)


class SyncGate(Gate):
    """A gate with the optional synchronous ``ready_now`` (as the supervisor has)."""

    def __init__(self, **states: bool | None) -> None:
        super().__init__(**states)
        self.now_calls = 0
        self.broken = False

    def ready_now(self, service_key: str) -> bool:
        self.now_calls += 1
        if self.broken:
            raise RuntimeError("ready_now failed")
        return self.states.get(service_key) is True


def test_ready_now_hands_over_without_waiting_and_keeps_order_and_errors_safe(caplog):
    async def scenario():
        gate = SyncGate(m__s=True)
        broker = Broker(gate)
        _ch, svc = await ready_service(broker, "m/s")
        job = job_peer(broker, "a", "m/s")
        # Ready now: handed over in place, wait_ready never asked.
        for _ in range(3):
            msg, end = await asyncio.to_thread(job_connect, job)
            assert msg["ok"] is True
            end.close()
            (await asyncio.to_thread(service_accept, svc))[1].close()
        assert gate.calls == 0 and gate.now_calls == 3

        # Starting: the connect waits, and one sent behind it is answered after it, in order.
        gate.set("m/s", None)
        job.send({"op": "connect", "pid": 1})
        await until(lambda: gate.calls == 1 and broker.stats()["queued_connects"] == 1,
                    "the first connect waiting on the gate")
        gate.states["m/s"] = True  # ready_now would say yes, but a connect is queued ahead
        job.send({"op": "connect", "pid": 2})
        # handed over in place, it would never be queued
        await until(lambda: broker.stats()["queued_connects"] == 2,
                    "the second connect queued behind the first")
        gate.set("m/s", True)
        for _ in range(2):
            msg, fds = await asyncio.to_thread(job.read)
            assert msg["ok"] is True and len(fds) == 1
            job.send({"op": "received", "conn": msg["conn"]})
            os.close(fds[0])
            (await asyncio.to_thread(service_accept, svc))[1].close()

        # A ready_now that raises is logged and the waited path answers instead.
        gate.broken = True
        with caplog.at_level(logging.ERROR, logger="oarbank_agent.broker.handover"):
            msg, end = await asyncio.to_thread(job_connect, job)
        assert msg["ok"] is True
        end.close()
        (await asyncio.to_thread(service_accept, svc))[1].close()
        assert "ready_now" in caplog.text
        await broker.aclose()
        job.close()
        svc.close()

    run(scenario)


class ChannelGate(SyncGate):
    """Ready as the supervisor says it (``runtime.ready``): the state True and the service's
    channel open; ``wait_ready`` waits (for ``set``) while it is not."""

    broker: Broker

    def _up(self, key: str) -> bool:
        ch = self.broker.channels.get(key)
        return ch is not None and ch.usable

    def ready_now(self, service_key: str) -> bool:
        return super().ready_now(service_key) and self._up(service_key)

    async def wait_ready(self, service_key: str) -> bool:
        self.calls += 1
        while True:
            state = self.states.get(service_key, False)
            if state is False:
                return False
            if state and self._up(service_key):
                return True
            await self._changed.wait()


def test_a_connect_as_the_service_dies_waits_for_its_next_run():
    """The service dies just as a connect comes: whether the agent has read its channel's end
    yet (then it is not ready) or finds it as it sends (ready a moment ago, the send breaks),
    the connect is not refused: it waits for the service's next run and is handed to it."""
    async def scenario():
        gate = ChannelGate(m__s=True)
        broker = Broker(gate)
        gate.broker = broker
        _ch, svc = await ready_service(broker, "m/s")
        job = job_peer(broker, "a", "m/s")
        msg, end = await asyncio.to_thread(job_connect, job)
        assert msg["ok"] is True
        end.close()
        (await asyncio.to_thread(service_accept, svc))[1].close()

        # The connect, then the service's death, both before the loop looks: it reads the
        # connect first (the channel still open, so ready) and the hand-over's send breaks.
        job.send({"op": "connect", "pid": 1})
        svc.close()
        # Waiting, not refused: the broker has seen the channel go, and the connect waits on
        # the gate for the next run (a refusal would have emptied the queue first).
        await until(lambda: broker.stats()["channels"] == 0 and gate.calls >= 1, "the death seen")
        assert broker.stats()["queued_connects"] == 1
        _ch2, svc2 = await ready_service(broker, "m/s")  # its next run
        gate.set("m/s", True)
        msg, fds = await asyncio.to_thread(job.read)
        assert msg["ok"] is True and len(fds) == 1, msg
        job.send({"op": "received", "conn": msg["conn"]})
        os.close(fds[0])
        (await asyncio.to_thread(service_accept, svc2))[1].close()
        await broker.aclose()
        job.close()
        svc2.close()

    run(scenario)


def test_a_hand_over_that_breaks_twice_is_refused_naming_the_channel():
    """Ready by the gate's word each time, but no channel to hand to: one more wait, then a
    refusal (never a connect that waits forever on a service that does not come back)."""
    async def scenario():
        gate = SyncGate(m__s=True)  # ready, whatever the channel says
        broker = Broker(gate)
        ch, svc = await ready_service(broker, "m/s")
        job = job_peer(broker, "a", "m/s")
        ch.close()
        msg, _ = await asyncio.to_thread(job_connect, job)
        assert msg["error"] == "service_unavailable" and "channel" in msg["detail"], msg
        assert gate.calls == 1  # the one wait before the refusal
        await broker.aclose()
        job.close()
        svc.close()

    run(scenario)


# --- attempts ending ----------------------------------------------------------------------


def test_end_attempt_sends_ended_to_every_reached_service_and_closes_connectors():
    async def scenario():
        base = open_fds()
        broker = Broker(Gate(m__one=True, m__two=True, m__three=True))
        services = {k: await ready_service(broker, k) for k in ("m/one", "m/two", "m/three")}
        jobs = {k: job_peer(broker, "att", k) for k in services}
        other = job_peer(broker, "other", "m/three")
        for key in ("m/one", "m/two"):
            _msg, end = await asyncio.to_thread(job_connect, jobs[key])
            end.close()
            # The service never sends `accepted`: end_attempt drops the agent's copy.
            msg, fds = await asyncio.to_thread(services[key][1].read)
            assert msg["attempt"] == broker.wire_attempt("att")
            os.close(fds[0])
        _msg, end = await asyncio.to_thread(job_connect, other)
        end.close()
        (await asyncio.to_thread(service_accept, services["m/three"][1]))[1].close()
        assert broker.reached("att") == {"m/one", "m/two"}
        assert broker.stats()["pending_ends"] == 2
        att, other_wire = broker.wire_attempt("att"), broker.wire_attempt("other")
        assert att != other_wire

        broker.end_attempt("att")
        for key in ("m/one", "m/two"):
            msg, fds = await asyncio.to_thread(services[key][1].read)
            assert msg == {"op": "ended", "attempt": att} and fds == []
        for job in jobs.values():
            assert await asyncio.to_thread(job.read) == (None, [])  # EOF
            # A connect after the attempt ended goes nowhere: the connector is closed.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                job.send({"op": "connect", "pid": 1})
        assert broker.reached("att") == set()
        assert broker.stats()["pending_ends"] == 0
        assert broker.stats()["connectors"] == 1
        # m/three was not reached by "att": nothing more arrives there; "other" still works.
        svc3 = services["m/three"][1]
        svc3.sock.settimeout(0.2)
        try:
            await asyncio.to_thread(svc3.read)
            raise AssertionError("m/three got a message for an attempt that never reached it")
        except TimeoutError:
            pass
        svc3.sock.settimeout(TIMEOUT)
        _msg, end = await asyncio.to_thread(job_connect, other)
        end.close()
        (await asyncio.to_thread(service_accept, svc3))[1].close()
        broker.end_attempt("other")
        msg, _ = await asyncio.to_thread(svc3.read)
        assert msg == {"op": "ended", "attempt": other_wire}
        await broker.aclose()
        for p in [*jobs.values(), other, *(s for _c, s in services.values())]:
            p.close()
        assert open_fds() == base

    run(scenario)


def test_attempt_wire_ids_are_integers_unique_for_the_agent_and_logged_with_their_names(caplog):
    # Contract section 3: the channel names attempts by positive integers, never reused in
    # the agent's lifetime (upstream's SDK does int(msg["attempt"])); the log maps them back.
    async def scenario():
        broker = Broker(Gate(m__s=True))
        other = Broker(Gate(m__s=True))  # a second broker in the same agent process
        _ch, svc = await ready_service(broker, "m/s")
        with caplog.at_level(logging.INFO, logger="oarbank_agent.broker.handover"):
            job = job_peer(broker, "j1.1", "m/s")
        first = broker.wire_attempt("j1.1")
        assert broker.wire_attempt("j1.1") == first  # stable while the attempt lives
        assert f"attempt=j1.1 (wire {first})" in caplog.text
        _msg, end = await asyncio.to_thread(job_connect, job)
        end.close()
        msg, conn_end = await asyncio.to_thread(service_accept, svc)
        conn_end.close()
        assert type(msg["attempt"]) is int and msg["attempt"] == first
        broker.end_attempt("j1.1")
        assert await asyncio.to_thread(svc.read) == ({"op": "ended", "attempt": first}, [])
        # The same name again (a retried attempt would get a new name; this is the worst
        # case) and another broker's attempts: fresh numbers, none reused.
        again = broker.wire_attempt("j1.1")
        elsewhere = other.wire_attempt("j2.1")
        assert len({first, again, elsewhere}) == 3 and min(first, again, elsewhere) > 0
        broker.end_attempt("j1.1")
        other.end_attempt("j2.1")
        await broker.aclose()
        await other.aclose()
        job.close()
        svc.close()

    run(scenario)


def test_a_second_connector_for_the_same_attempt_and_service_is_refused():
    async def scenario():
        broker = Broker(Gate())
        broker.open_connector("a", "m/s")
        try:
            broker.open_connector("a", "m/s")
            raise AssertionError("expected ValueError")
        except ValueError as exc:
            assert "already has a connector" in str(exc)
        await broker.aclose()
        assert broker.stats()["child_ends"] == 0

    run(scenario)


# --- channels -----------------------------------------------------------------------------


def test_channel_failures_resolve_closed_with_a_reason():
    cases = [
        (b'{"op":"accepted","conn":1}\n', "'accepted' before 'hello'"),
        (b'{"op":"hello","pid":1}\n{"op":"hello","pid":1}\n', "second 'hello'"),
        (b"\x00\x01binary\n", "protocol violation"),
        (b'{"op":"connect","pid":1}\n', "unknown op 'connect'"),
        (b"x" * 5000, "protocol violation"),
        (b"", "the service closed its channel (end of file)"),
        (b'{"op":"hel', "mid-message"),
    ]

    async def scenario():
        base = open_fds()
        broker = Broker(Gate())
        for data, needle in cases:
            ch = broker.open_channel("m/s")
            svc = Peer(ch.child_fd)
            ch.close_child_end()
            if data:
                svc.send(data)
            if needle in ("the service closed its channel (end of file)", "mid-message"):
                svc.sock.shutdown(socket.SHUT_WR)
            reason = await asyncio.wait_for(ch.closed, TIMEOUT)
            assert needle in reason, (needle, reason)
            assert not ch.is_open
            assert await asyncio.to_thread(svc.read) == (None, [])  # the agent closed its end
            svc.close()
        assert broker.stats()["channels"] == 0
        await broker.aclose()
        assert open_fds() == base

    run(scenario)


def test_open_channel_replaces_the_previous_one_silently():
    async def scenario():
        broker = Broker(Gate(m__s=True))
        old, old_svc = await ready_service(broker, "m/s")
        new, new_svc = await ready_service(broker, "m/s")
        assert not old.is_open and not old.closed.done()
        assert await asyncio.to_thread(old_svc.read) == (None, [])
        job = job_peer(broker, "a", "m/s")
        msg, end = await asyncio.to_thread(job_connect, job)
        end.close()
        (await asyncio.to_thread(service_accept, new_svc))[1].close()
        assert broker.stats()["channels"] == 1
        await broker.aclose()
        for p in (job, old_svc, new_svc):
            p.close()

    run(scenario)


# --- hostile peers ------------------------------------------------------------------------


def test_descriptors_a_peer_attaches_are_closed_unused():
    async def scenario():
        base = open_fds()
        broker = Broker(Gate(m__s=True))
        ch, svc = await ready_service(broker, "m/s")
        job = job_peer(broker, "a", "m/s")
        probes = []
        for peer, msg in ((job, {"op": "connect", "pid": 1}), (svc, {"op": "accepted", "conn": 0})):
            mine, theirs = socket.socketpair()
            peer.send(msg, attach=theirs.fileno())
            theirs.close()  # now only the copy in flight / at the agent keeps it open
            mine.settimeout(TIMEOUT)
            probes.append(mine)
        msg, fds = await asyncio.to_thread(job.read)
        assert msg["ok"] is True  # the message itself is still answered
        os.close(fds[0])
        job.send({"op": "received", "conn": msg["conn"]})
        (await asyncio.to_thread(service_accept, svc))[1].close()
        for mine in probes:
            # EOF proves the agent closed the descriptor it was sent.
            assert await asyncio.to_thread(mine.recv, 10) == b""
            mine.close()
        assert ch.is_open  # attaching a descriptor is not a protocol failure
        await broker.aclose()
        job.close()
        svc.close()
        assert open_fds() == base

    run(scenario)


def test_hostile_lines_never_crash_the_broker_and_others_keep_working():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    )
    messages = st.dictionaries(
        st.sampled_from(["op", "pid", "conn", "attempt", "ok", "x"]), json_values, max_size=4
    ) | st.fixed_dictionaries(
        {"op": st.sampled_from(["connect", "received", "hello", "accepted"])},
        optional={"pid": json_values, "conn": json_values},
    )
    chunks = st.lists(
        st.binary(max_size=300)
        | messages.map(lambda m: json.dumps(m).encode() + b"\n")
        | st.just(b"\n")
        | st.just(b"y" * 5000),
        max_size=6,
    )

    @settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(chunks=chunks, hang_up=st.booleans())
    def check(chunks: list[bytes], hang_up: bool) -> None:
        async def scenario():
            base = open_fds()
            broker = Broker(Gate(m__s=True))
            _ch, svc = await ready_service(broker, "m/s")
            hostile = job_peer(broker, "evil", "m/s")
            good = job_peer(broker, "good", "m/s")
            for data in chunks:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    hostile.send(data)
            if hang_up:
                hostile.sock.shutdown(socket.SHUT_WR)
            msg, end = await asyncio.to_thread(job_connect, good)
            assert msg["ok"] is True, msg
            end.close()
            # The service end of the good connection (and any the hostile one got).
            while True:
                m, fds = await asyncio.to_thread(svc.read)
                for fd in fds:
                    os.close(fd)
                if m["attempt"] == broker.wire_attempt("good"):
                    break
            await broker.aclose()
            hostile.close()
            good.close()
            svc.close()
            assert open_fds() == base

        run(scenario)

    check()


def test_a_peer_that_never_reads_is_cut_off_not_buffered_without_bound(caplog):
    async def scenario():
        broker = Broker(Gate(m__s=True))
        job = job_peer(broker, "a", "m/s")
        other = job_peer(broker, "b", "m/s")
        _ch, svc = await ready_service(broker, "m/s")
        job.sock.settimeout(None)
        job.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

        def write_until_cut_off() -> int:
            sent = 0
            try:
                while sent < 50_000_000:
                    job.sock.sendall(b"\n" * 65536)  # each empty line earns a refusal
                    sent += 65536
            except (BrokenPipeError, ConnectionResetError):
                pass
            return sent

        sent = await asyncio.to_thread(write_until_cut_off)
        assert sent < 50_000_000, "the broker kept reading without bound"
        assert broker.stats()["connectors"] == 1
        msg, end = await asyncio.to_thread(job_connect, other)
        assert msg["ok"] is True
        end.close()
        (await asyncio.to_thread(service_accept, svc))[1].close()
        await broker.aclose()
        for p in (job, other, svc):
            p.close()

    with caplog.at_level(logging.INFO, logger="oarbank_agent.broker.handover"):
        run(scenario)
    assert any("peer is not reading" in r.getMessage() for r in caplog.records)


def test_a_flood_of_10000_connects_does_not_hurt_other_attempts():
    async def scenario():
        base = open_fds()
        broker = Broker(Gate(m__s=True))
        _ch, svc = await ready_service(broker, "m/s")
        async with accepting_everything(svc):
            fd = broker.open_connector("flood", "m/s")
            flood = subprocess.Popen(
                [sys.executable, str(PEERS), "flood", f"fd:{fd}", "10000"],
                pass_fds=(fd,),
                stdout=subprocess.PIPE,
                start_new_session=True,
                text=True,
            )
            try:
                broker.close_child_ends("flood")
                good = job_peer(broker, "good", "m/s")

                def steady() -> int:
                    ok = 0
                    while flood.poll() is None or ok < 5:
                        msg, end = job_connect(good)
                        assert msg["ok"] is True, msg
                        end.close()
                        ok += 1
                        time.sleep(0.01)
                    return ok

                ok = await asyncio.to_thread(steady)
                out, _ = await asyncio.to_thread(flood.communicate, timeout=60)
                assert flood.returncode == 0
                counts = dict(kv.split("=") for kv in out.split())
                # Every one of the 10,000 lines was answered; the bucket let ~64 through.
                assert int(counts["ok"]) + int(counts["refused"]) == 10000, counts
                assert 64 <= int(counts["ok"]) <= 64 + 32 * 30, counts
                assert ok >= 5
            finally:
                if flood.poll() is None:
                    os.killpg(flood.pid, signal.SIGKILL)
                    flood.wait()
                flood.stdout.close()
        broker.end_attempt("flood")
        broker.end_attempt("good")
        await broker.aclose()
        good.close()
        svc.close()
        assert open_fds() == base

    run(scenario)


def test_an_attempts_with_block_ends_it_on_every_path():
    """Broker.attempt: leaving the block (here by an error, with a child end still held)
    closes what the attempt holds and ends it, as run_attempt relies on."""
    async def scenario():
        broker = Broker(Gate())
        before = open_fds()
        try:
            with broker.attempt("a1"):
                broker.open_connector("a1", "m/s")
                assert broker.wire_attempts()[0]  # numbered while it runs
                raise RuntimeError("the runner could not start")
        except RuntimeError:
            pass
        assert broker.wire_attempts()[0] == set()  # ended
        assert open_fds() == before  # child end and connector closed
        with broker.attempt("a2"):  # a normal exit ends it too
            broker.open_connector("a2", "m/s")
            broker.close_child_ends("a2")
        assert broker.wire_attempts()[0] == set()
        await broker.aclose()

    run(scenario)
