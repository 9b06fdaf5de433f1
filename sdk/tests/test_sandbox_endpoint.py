"""The endpoint path works inside the sandbox, end to end, over real descriptors.

The test plays the agent and the job; the service runs inside ``sandbox.wrap`` and speaks the
endpoint wire format (``_wire``/``_transport``, what ``service_endpoint`` is built on) over
an inherited channel: hello, a connection handed over with SCM_RIGHTS, accepted, a request
and its answer on the handed stream, ended, EOF.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from oarbank_sdk import _transport, _wire, sandbox

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")

SERVICE = textwrap.dedent(
    r"""
    import os, socket
    from oarbank_sdk import _transport, _wire

    t = _transport.current()
    channel = t.open_stream(t.parse(os.environ["OARBANK_ENDPOINT_CHANNEL"]))
    try:
        socket.socket(socket.AF_UNIX)
    except PermissionError:
        pass
    else:
        raise SystemExit("socket() was allowed inside the sandbox")
    channel.sendall(_wire.encode(_wire.Hello(os.getpid()).to_wire()))
    lines = _wire.LineSplitter()
    pending = []
    while True:
        data, fds = t.recv(channel, 4096)
        pending.extend(fds)
        if not data:
            break  # the agent closed the channel: stop
        for line in lines.feed(data):
            msg = _wire.parse_to_service(_wire.decode(line))
            if isinstance(msg, _wire.Connection):
                conn = t.open_stream(pending.pop(0))
                channel.sendall(_wire.encode(_wire.Accepted(msg.conn).to_wire()))
                with conn:
                    request = conn.recv(100)
                    conn.sendall(request.upper() + f" attempt={msg.attempt}".encode())
            elif isinstance(msg, _wire.Ended):
                channel.sendall(_wire.encode({"op": "accepted", "conn": 999}))  # marks 'ended seen'
    """
)


def _read_msg(sock: socket.socket, t) -> tuple[dict, list[int]]:
    buf = b""
    fds: list[int] = []
    while not buf.endswith(b"\n"):
        data, got = t.recv(sock, 4096)
        fds += got
        assert data, "service closed the channel early"
        buf += data
    return _wire.decode(buf.rstrip(b"\n")), fds


def test_endpoint_channel_and_handed_connection_work_inside_the_sandbox(tmp_path) -> None:
    t = _transport.current()
    agent_end, service_end = socket.socketpair()
    env = dict(os.environ, OARBANK_ENDPOINT_CHANNEL=t.format(service_end.fileno()))
    proc = subprocess.Popen(
        sandbox.wrap([sys.executable, "-I", "-c", SERVICE]),
        env=env,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **t.inheritable_kwargs(service_end.fileno()),
    )
    service_end.close()  # the child has its copy now
    try:
        agent_end.settimeout(30)
        hello, _ = _read_msg(agent_end, t)
        # The launcher exec'd in place: the hello pid is the pid the agent spawned.
        assert _wire.parse_from_service(hello) == _wire.Hello(proc.pid)

        job_end, handed = socket.socketpair()
        with job_end:
            t.send(agent_end, _wire.encode(_wire.Connection(1, "att-1").to_wire()), attach=handed.fileno())
            handed.close()
            accepted, _ = _read_msg(agent_end, t)
            assert _wire.parse_from_service(accepted) == _wire.Accepted(1)
            job_end.settimeout(30)
            job_end.sendall(b"ping")
            assert job_end.recv(100) == b"PING attempt=att-1"

        agent_end.sendall(_wire.encode(_wire.Ended("att-1").to_wire()))
        marker, _ = _read_msg(agent_end, t)
        assert marker == {"op": "accepted", "conn": 999}
        agent_end.close()  # stop: the service sees EOF and exits
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        agent_end.close()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
