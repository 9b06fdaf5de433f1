"""oarbank_sdk.protocol: the wire, the transport seam and the op-output reader, public."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from oarbank_sdk import protocol
from oarbank_sdk.protocol import current_transport, last_json_object, wire


def test_the_public_names_are_the_private_modules_parts() -> None:
    from oarbank_sdk import _opdoc, _transport, _winpipe, _wire

    assert wire is _wire
    assert protocol.PipeStream is _winpipe.PipeStream
    assert protocol.connected_pipe is _winpipe.connected_pipe
    assert protocol.Transport is _transport.Transport
    assert last_json_object is _opdoc.last_json_object
    assert protocol.MAX_HANDLES == _transport.MAX_HANDLES
    assert set(protocol.__all__) == {"wire", "MAX_HANDLES", "Transport", "UnsupportedHandle",
                                     "current_transport", "last_json_object", "PipeStream",
                                     "connected_pipe", "duplicate_into", "close_in"}


def test_a_pair_is_connected_and_kept_from_children_unless_asked() -> None:
    t = current_transport()
    ours, theirs = t.pair()
    with ours, theirs:
        assert not ours.get_inheritable() and not theirs.get_inheritable()
        assert ours.getblocking() and theirs.getblocking()
        ours.sendall(b"x")
        assert theirs.recv(1) == b"x"
    ours, child = t.pair(child=True)
    with ours, child:
        assert child.get_inheritable() and not ours.get_inheritable()


@pytest.mark.skipif(sys.platform == "win32", reason="fd: handles are POSIX")
def test_a_child_gets_the_handle_by_its_formatted_name() -> None:
    t = current_transport()
    ours, child = t.pair(child=True)
    with ours, child:
        name = t.format(child.fileno())
        assert name == f"fd:{child.fileno()}" and t.parse(name) == child.fileno()
        kw = t.inheritable_kwargs(child.fileno())
        assert kw == {"pass_fds": (child.fileno(),), "close_fds": True}
        code = ("import os, socket, sys; from oarbank_sdk.protocol import current_transport; "
                "s = current_transport().open_stream(current_transport().parse(sys.argv[1])); "
                "s.sendall(b'hi')")
        proc = subprocess.run([sys.executable, "-c", code, name], timeout=60,
                              env={**os.environ}, **kw)
        assert proc.returncode == 0
        assert ours.recv(2) == b"hi"
    assert t.inheritable_kwargs() == {"pass_fds": (), "close_fds": True}
    assert t.inheritable_kwargs(5, 7)["pass_fds"] == (5, 7)


def test_the_wire_round_trips_through_the_public_module() -> None:
    line = wire.encode(wire.Refusal("rate_limited", "slow down").to_wire())
    assert wire.decode(line.rstrip(b"\n"))["error"] == "rate_limited"
    assert last_json_object('noise\n{"ready": true}\n') == {"ready": True}
