"""service_endpoint, job and service sides, against the test's agent stand-in.

Real socketpairs, real SCM_RIGHTS descriptors, real threads and processes. The agent role is
played by ``endpoint_helpers.FakeAgent`` (a stand-in: the real broker is written in parallel;
tests against it live in agent/tests) or, for malformed-message cases, by hand (``RawPeer``).
"""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import threading
import warnings

import endpoint_helpers as H  # sdk/tests (conftest.py puts it on the path)
import pytest
from platform_marks import fake_agent  # sdk/tests

from oarbank_sdk import service_endpoint as ep
from oarbank_sdk.endpoint import job as endpoint_job

pytestmark = fake_agent


@pytest.fixture
def fd_check():
    """Descriptor counts return to baseline once the test's objects are closed."""
    base = H.open_fds()
    yield
    endpoint_job._forget_connectors()
    extra = H.fds_settle(base)
    assert not extra, f"descriptors leaked: {sorted(extra)}"


@pytest.fixture
def agent(fd_check):
    a = H.FakeAgent(channel=False)
    yield a
    endpoint_job._forget_connectors()
    a.close()


@pytest.fixture
def job_env(agent, monkeypatch):
    """An attempt with a connector for service "model", as the agent gives a runner."""
    end = agent.open_connector("att-1")
    monkeypatch.setenv("OARBANK_SERVICE_MODEL", f"fd:{end.detach()}")  # the SDK owns it now
    endpoint_job._connector("model")  # adopt it now, as the first connect would
    return agent


@pytest.fixture
def raw(fd_check, monkeypatch):
    """A connector whose agent end the test speaks by hand."""
    agent_end, job_end = socket.socketpair()
    monkeypatch.setenv("OARBANK_SERVICE_MODEL", f"fd:{job_end.detach()}")
    endpoint_job._connector("model")  # adopt it now, as the first connect would
    peer = H.RawPeer(agent_end)
    yield peer
    endpoint_job._forget_connectors()
    peer.close()


# --- job side ------------------------------------------------------------------------------------


def test_connect_exchange_gives_a_working_stream_and_sends_the_receipt(job_env):
    conn = ep.connect("model", timeout=5)
    try:
        assert job_env.wait(lambda: len(job_env.service_ends) == 1)
        service_end, attempt = job_env.service_ends.popleft()
        assert attempt == "att-1"
        conn.sendall(b"ping")
        assert service_end.recv(10) == b"ping"
        service_end.sendall(b"pong")
        assert conn.recv(10) == b"pong"
        service_end.close()
        assert job_env.wait(lambda: job_env.received == [1])
        assert job_env.connect_pids == [os.getpid()]
        assert not conn.get_inheritable()
    finally:
        conn.close()


def test_refusal_raises_code_and_detail_then_next_connect_works(job_env):
    job_env.refusals.append(("service_unavailable", "model is not ready within 120s"))
    job_env.refusals.append(("rate_limited", "burst of 64 used"))
    with pytest.raises(ep.EndpointError) as info:
        ep.connect("model", timeout=5)
    assert (info.value.code, info.value.detail) == ("service_unavailable", "model is not ready within 120s")
    with pytest.raises(ep.EndpointError) as info:
        ep.connect("model", timeout=5)
    assert info.value.code == "rate_limited"
    assert not isinstance(info.value, ep.ChannelClosed)
    conn = ep.connect("model", timeout=5)
    conn.close()
    assert job_env.wait(lambda: job_env.received == [1])


@pytest.mark.parametrize(("value", "code"), [
    (None, "no_endpoint"), ("", "no_endpoint"),  # unset: upstream's code
    ("fd:abc", "bad_endpoint"), ("pipe:3", "bad_endpoint"), ("fd:987654", "bad_endpoint"),
])
def test_missing_connector_is_no_endpoint_and_a_bad_one_bad_endpoint(fd_check, monkeypatch,
                                                                      value, code):
    if value is None:
        monkeypatch.delenv("OARBANK_SERVICE_MODEL", raising=False)
    else:
        monkeypatch.setenv("OARBANK_SERVICE_MODEL", value)
    with pytest.raises(ep.EndpointError) as info:
        ep.connect("model")
    assert info.value.code == code
    assert "OARBANK_SERVICE_MODEL" in info.value.detail


def test_connector_that_is_not_a_socket_is_bad_endpoint(fd_check, monkeypatch):
    r, w = os.pipe()
    try:
        monkeypatch.setenv("OARBANK_SERVICE_MODEL", f"fd:{r}")
        with pytest.raises(ep.EndpointError) as info:
            ep.connect("model")
        assert info.value.code == "bad_endpoint"
    finally:
        os.close(r)
        os.close(w)


def test_connector_eof_raises_channel_closed_and_stays_closed(raw):
    raw.sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(ep.ChannelClosed) as info:
        ep.connect("model", timeout=5)
    assert info.value.code == "closed"
    assert isinstance(info.value, ep.EndpointError)
    with pytest.raises(ep.ChannelClosed):
        ep.connect("model", timeout=5)


def test_many_threads_connect_at_once(job_env):
    n_threads, per_thread = 12, 4
    got: list[socket.socket] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(n_threads)

    def worker(i: int) -> None:
        try:
            start.wait()
            for j in range(per_thread):
                s = ep.connect("model", timeout=10)
                s.sendall(f"{i}-{j}\n".encode())
                with lock:
                    got.append(s)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert not errors
        total = n_threads * per_thread
        assert job_env.wait(lambda: len(job_env.service_ends) == total and len(job_env.received) == total)
        tokens = set()
        for service_end, _ in job_env.service_ends:
            service_end.settimeout(5)
            tokens.add(service_end.recv(64).decode())
        # every stream reached its own service end: no reply went to the wrong thread twice
        assert tokens == {f"{i}-{j}\n" for i in range(n_threads) for j in range(per_thread)}
        assert sorted(job_env.received) == list(range(1, total + 1))
    finally:
        for s in got:
            s.close()


def test_ok_reply_without_descriptor_is_bad_message(raw):
    raw.send({"ok": True, "conn": 7})
    with pytest.raises(ep.EndpointError) as info:
        ep.connect("model", timeout=5)
    assert info.value.code == "bad_message"
    assert "descriptor" in info.value.detail
    assert raw.read() == {"op": "connect", "pid": os.getpid()}


def test_malformed_and_overlong_replies_are_bad_messages_and_stream_stays_in_step(raw):
    a, b = socket.socketpair()
    try:
        raw.send(b"this is not json\n")
        raw.send(b'{"ok": "yes"}\n')
        raw.send(b"x" * 5000 + b"\n")
        raw.send({"ok": True, "conn": 3}, attach=a.fileno())
        for _ in range(3):
            with pytest.raises(ep.EndpointError) as info:
                ep.connect("model", timeout=5)
            assert info.value.code == "bad_message"
        conn = ep.connect("model", timeout=5)
        a.close()
        conn.sendall(b"hi")
        assert b.recv(5) == b"hi"
        conn.close()
        msgs = [raw.read() for _ in range(5)]
        assert msgs[:4] == [{"op": "connect", "pid": os.getpid()}] * 4
        assert msgs[4] == {"op": "received", "conn": 3}
    finally:
        a.close()
        b.close()


def test_descriptor_on_a_refusal_is_closed_not_used(raw):
    socketpair = socket.socketpair()
    a, b = socketpair
    try:
        raw.send({"ok": False, "error": "bad_request", "detail": "x"}, attach=a.fileno())
        a.close()
        with pytest.raises(ep.EndpointError) as info:
            ep.connect("model", timeout=5)
        assert info.value.code == "bad_request"
        # our copy was closed, so the other end of that pair sees end of file
        b.settimeout(5)
        assert b.recv(1) == b""
    finally:
        for s in socketpair:
            s.close()


def test_timeout_then_late_reply_is_drained_and_receipted(raw):
    with pytest.raises(ep.EndpointError) as info:
        ep.connect("model", timeout=0.2)
    assert info.value.code == "timeout"
    assert raw.read() == {"op": "connect", "pid": os.getpid()}
    late_a, late_b = socket.socketpair()
    new_a, new_b = socket.socketpair()
    try:
        raw.send({"ok": True, "conn": 1}, attach=late_a.fileno())
        raw.send({"ok": True, "conn": 2}, attach=new_a.fileno())
        late_a.close()
        new_a.close()
        conn = ep.connect("model", timeout=5)
        conn.sendall(b"2")
        assert new_b.recv(1) == b"2"  # the new connection is conn 2, not the late one
        conn.close()
        late_b.settimeout(5)
        assert late_b.recv(1) == b""  # the late connection was received and closed
        assert [raw.read() for _ in range(3)] == [
            {"op": "received", "conn": 1},
            {"op": "connect", "pid": os.getpid()},
            {"op": "received", "conn": 2},
        ]
    finally:
        for s in (late_a, late_b, new_a, new_b):
            s.close()


def test_forked_child_gets_fresh_lock(job_env):
    ep.connect("model", timeout=5).close()  # opens the connector in this process
    (connector,) = endpoint_job._connectors.values()
    # A parent thread mid-exchange at fork time holds the lock; the child must not inherit it.
    connector.lock.acquire()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 1
            try:
                s = ep.connect("model", timeout=5)
                s.sendall(b"child")
                s.close()
                code = 0
            finally:
                os._exit(code)
    finally:
        connector.lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert job_env.wait(lambda: len(job_env.service_ends) == 2)
    child_end = job_env.service_ends[1][0]
    child_end.settimeout(5)
    assert child_end.recv(10) == b"child"
    assert job_env.connect_pids == [os.getpid(), pid]


def test_inherit_connector_passes_it_to_a_child(job_env):
    kwargs = ep.inherit_connector("model")
    fd = endpoint_job._connector("model").stream.fileno()
    assert kwargs["pass_fds"] == (fd,)
    assert kwargs["env"]["OARBANK_SERVICE_MODEL"] == f"fd:{fd}"
    code = (
        "from oarbank_sdk import service_endpoint as ep\n"
        "s = ep.connect('model', timeout=5); s.sendall(b'from child'); s.close()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=30, **kwargs)
    assert proc.returncode == 0
    assert job_env.wait(lambda: len(job_env.service_ends) == 1)
    end = job_env.service_ends[0][0]
    end.settimeout(5)
    assert end.recv(20) == b"from child"
    assert job_env.connect_pids[0] != os.getpid()


# --- service side --------------------------------------------------------------------------------


@pytest.fixture
def chan(fd_check):
    """A FakeAgent with a channel, and an Acceptor on the service end (in this process)."""
    agent = H.FakeAgent(channel=True)
    acc = ep.Acceptor(channel=f"fd:{agent.channel_child.detach()}")
    agent.channel_child = None
    yield agent, acc
    acc.close()
    agent.close()


def _hand(agent, attempt: str, conn: int) -> socket.socket:
    """The agent hands the service a fresh connection; returns the job's end."""
    job_end, service_end = socket.socketpair()
    agent.send_channel({"op": "connection", "conn": conn, "attempt": attempt}, service_end.fileno())
    service_end.close()  # the real agent keeps it until `accepted`; here the kernel holds it
    return job_end


def test_acceptor_says_hello_and_accepts_with_receipt(chan):
    agent, acc = chan
    assert agent.wait(lambda: agent.hello_pids == [os.getpid()])
    job_end = _hand(agent, "att-9", 41)
    conn, attempt = acc.accept()
    try:
        assert attempt == "att-9"
        assert isinstance(conn, socket.socket)
        job_end.sendall(b"q")
        assert conn.recv(1) == b"q"
        assert agent.wait(lambda: agent.accepted == [41])
        assert acc.open_connections("att-9") == 1
    finally:
        conn.close()
        job_end.close()
    assert acc.open_connections() == 0  # closed by the handler: forgotten


def test_acceptor_reads_channel_from_env(fd_check, monkeypatch):
    agent = H.FakeAgent(channel=True)
    try:
        monkeypatch.setenv("OARBANK_ENDPOINT_CHANNEL", f"fd:{agent.channel_child.detach()}")
        agent.channel_child = None
        acc = ep.Acceptor()
        assert agent.wait(lambda: agent.hello_pids == [os.getpid()])
        acc.close()
    finally:
        agent.close()


@pytest.mark.parametrize(("value", "code"), [
    (None, "no_channel"), ("fd:x", "bad_endpoint"), ("fd:987654", "bad_endpoint"),
])
def test_missing_channel_is_no_channel_and_a_bad_one_bad_endpoint(fd_check, monkeypatch, value,
                                                                  code):
    if value is None:
        monkeypatch.delenv("OARBANK_ENDPOINT_CHANNEL", raising=False)
    else:
        monkeypatch.setenv("OARBANK_ENDPOINT_CHANNEL", value)
    for call in (ep.Acceptor, ep.inherit_channel):
        with pytest.raises(ep.EndpointError) as info:
            call()
        assert info.value.code == code
        assert "OARBANK_ENDPOINT_CHANNEL" in info.value.detail


def test_inherit_channel_gives_popen_kwargs(fd_check, monkeypatch):
    a, b = socket.socketpair()
    try:
        monkeypatch.setenv("OARBANK_ENDPOINT_CHANNEL", f"fd:{b.fileno()}")
        assert ep.inherit_channel() == {"pass_fds": (b.fileno(),), "close_fds": True}
    finally:
        a.close()
        b.close()


def test_cap_of_64_per_attempt_cuts_the_oldest(chan):
    agent, acc = chan
    job_ends = [_hand(agent, "big", i) for i in range(ep.CONNECTIONS_PER_ATTEMPT + 1)]
    other = _hand(agent, "small", 999)
    conns = [acc.accept()[0] for _ in range(ep.CONNECTIONS_PER_ATTEMPT + 2)]
    try:
        assert acc.open_connections("big") == 64
        assert acc.open_connections("small") == 1
        job_ends[0].settimeout(5)
        assert job_ends[0].recv(1) == b""  # the oldest was cut
        assert conns[0].fileno() == -1
        # the rest still work
        job_ends[1].sendall(b"a")
        assert conns[1].recv(1) == b"a"
        other.sendall(b"b")
        assert conns[-1].recv(1) == b"b"
    finally:
        for s in conns + job_ends + [other]:
            s.close()


def test_ended_closes_that_attempts_connections_only(chan):
    agent, acc = chan
    a_ends = [_hand(agent, "A", i) for i in range(3)]
    b_end = _hand(agent, "B", 10)
    conns = [acc.accept()[0] for _ in range(4)]
    agent.send_ended("A")
    c_end = _hand(agent, "B", 11)  # accept() handles `ended` while waiting for this one
    c_conn, attempt = acc.accept()
    try:
        assert attempt == "B"
        for e in a_ends:
            e.settimeout(5)
            assert e.recv(1) == b""
        assert acc.open_connections("A") == 0
        assert acc.open_connections("B") == 2
        b_end.sendall(b"x")
        assert conns[3].recv(1) == b"x"
    finally:
        for s in conns + a_ends + [b_end, c_end, c_conn]:
            s.close()


def test_dropped_connection_is_forgotten(chan):
    agent, acc = chan
    job_end = _hand(agent, "A", 1)
    conn, _ = acc.accept()
    assert acc.open_connections() == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # the unclosed socket, on purpose
        del conn
        gc.collect()
    assert acc.open_connections() == 0
    job_end.close()


def test_malformed_agent_messages_are_logged_skipped_and_their_descriptors_closed(chan, caplog):
    agent, acc = chan
    result: list = []
    t = threading.Thread(target=lambda: result.append(acc.accept()), daemon=True)
    t.start()
    stray_a, stray_b = socket.socketpair()
    orphan_a, orphan_b = socket.socketpair()
    try:
        # One at a time, each handled before the next is sent: a descriptor is paired with a
        # message starting in the same read, and this test is about each case on its own.
        bad = [
            (b"not json\n", None),
            ({"op": "dance"}, None),
            ({"op": "connection", "conn": 5}, None),  # no attempt, no descriptor
            ({"op": "connection", "conn": 6, "attempt": "A"}, None),  # no descriptor
            (b"{" + b"x" * 6000 + b"}\n", None),  # over the 4096-byte cap
            ({"op": "dance"}, orphan_a),
        ]
        for i, (msg, fd_sock) in enumerate(bad, 1):
            agent.send_channel(msg, None if fd_sock is None else fd_sock.fileno())
            assert H.poll(lambda i=i: acc.malformed == i), (i, acc.malformed)
        agent.send_channel({"op": "ended", "attempt": "A"}, stray_a.fileno())  # carries none
        stray_a.close()
        orphan_a.close()
        # descriptors riding on messages that should carry none were closed, never used
        for s in (stray_b, orphan_b):
            s.settimeout(5)
            assert s.recv(1) == b""
        good = _hand(agent, "A", 7)
        t.join(5)
        ((conn, attempt),) = result
        assert attempt == "A"
        good.sendall(b"g")
        assert conn.recv(1) == b"g"
        assert acc.malformed == len(bad)
        assert "no descriptor" in caplog.text
        assert "4096" in caplog.text
        assert agent.wait(lambda: agent.accepted == [7])
        conn.close()
        good.close()
    finally:
        for s in (stray_a, stray_b, orphan_a, orphan_b):
            s.close()


def test_descriptor_pairing_within_one_read(chan):
    """Several messages in one read, the descriptor with the one that should carry it."""
    agent, acc = chan
    a, b = socket.socketpair()
    try:
        data = (b'{"op":"ended","attempt":"X"}\n{"op":"connection","conn":3,"attempt":"Y"}\n')
        # the descriptor travels with the first byte of this send; the connection takes it
        agent.send_channel(data, a.fileno())
        a.close()
        conn, attempt = acc.accept()
        assert attempt == "Y"
        b.sendall(b"z")
        assert conn.recv(1) == b"z"
        conn.close()
        assert acc.malformed == 0
    finally:
        a.close()
        b.close()


def test_channel_eof_raises_channel_closed_and_ends_iteration(chan):
    agent, acc = chan
    job_end = _hand(agent, "A", 1)
    agent.close_channel()
    # The agent is stopping the service: a connection still in flight cannot be receipted,
    # so it is closed, not handed out.
    assert list(acc) == []
    with pytest.raises(ep.ChannelClosed):
        acc.accept()
    job_end.settimeout(5)
    assert job_end.recv(1) == b""
    job_end.close()


def test_serve_http_returns_on_channel_eof(chan):
    agent, acc = chan
    done = threading.Event()

    def run() -> None:
        ep.serve_http(H.EchoHandler, acc)
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    job_end = _hand(agent, "A", 1)
    job_end.sendall(b"GET /hello HTTP/1.1\r\nHost: model\r\nConnection: close\r\n\r\n")
    job_end.settimeout(5)
    reply = b""
    while chunk := job_end.recv(65536):
        reply += chunk
    assert reply.startswith(b"HTTP/1.1 200")
    assert b'"client": ["attempt-A", 0], "attempt": "A"' in reply
    job_end.close()
    assert not done.is_set()
    agent.close_channel()
    assert done.wait(10)
    t.join(5)


def test_close_wakes_a_blocked_accept(chan):
    agent, acc = chan
    raised: list[BaseException] = []

    def run() -> None:
        try:
            acc.accept()
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert agent.wait(lambda: agent.hello_pids == [os.getpid()])
    acc.close()
    t.join(5)
    assert not t.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], ep.ChannelClosed)


def test_acceptor_on_a_channel_the_agent_already_closed(fd_check):
    agent_end, service_end = socket.socketpair()
    agent_end.close()
    with pytest.raises(ep.ChannelClosed):
        ep.Acceptor(channel=f"fd:{service_end.detach()}")


def test_service_endpoint_imports_only_the_standard_library():
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import oarbank_sdk.service_endpoint\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'oarbank_sdk'}))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    assert out.strip() == "[]"
