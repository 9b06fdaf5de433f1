"""What the conformance kit counts as listening (``oarbank_sdk.conform.listeners``), seen in
another real process: UDP bound, abstract unix, TCP over IPv6; a connected UDP socket, a
socketpair and a socket never bound do not count."""

from __future__ import annotations

import subprocess
import sys

from oarbank_sdk.conform.listeners import listeners, related_pids

_HOLDER = r"""
import socket, sys, os, time
held = []
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); held.append(s)
a = socket.socket(socket.AF_UNIX); a.bind("\0oarbank-conform-test-%d" % os.getpid())
a.listen(); held.append(a)
t = socket.socket(socket.AF_INET6); t.bind(("::1", 0)); t.listen(); held.append(t)
# not listening: a connected UDP socket, a socketpair, a TCP socket never bound
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.connect(("127.0.0.1", 9)); held.append(c)
held.extend(socket.socketpair()); held.append(socket.socket())
print("ready", s.getsockname()[1], t.getsockname()[1], flush=True)
time.sleep(60)
"""


def test_listeners_sees_udp_abstract_unix_and_tcp6_in_another_process():
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, udp_port, tcp6_port = proc.stdout.readline().split()
        assert related_pids(proc.pid) == {proc.pid}
        found = sorted(str(x) for x in listeners({proc.pid}))
        assert found == sorted([
            f"pid {proc.pid}: UDP bound 127.0.0.1:{udp_port}",
            f"pid {proc.pid}: unix listening on @oarbank-conform-test-{proc.pid}",
            f"pid {proc.pid}: TCP listening on [::1]:{tcp6_port}",
        ])
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
