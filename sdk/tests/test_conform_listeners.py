"""What the conformance kit counts as listening (``oarbank_sdk.conform.listeners``), seen in
another real process: UDP bound, abstract unix, TCP over IPv6; a connected UDP socket, a
socketpair and a socket never bound do not count."""

from __future__ import annotations

import subprocess
import sys

from platform_marks import conform_kit  # sdk/tests

from oarbank_sdk.conform.listeners import listeners, related_pids, split_gpu_driver

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


pytestmark = conform_kit


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
        # A GPU module's driver may hold the abstract listener (CUDA's cuda-uvmfd), nothing else
        held = listeners({proc.pid})
        failing, driver = split_gpu_driver(held, gpu=True)
        assert [str(x) for x in driver] == [
            f"pid {proc.pid}: unix listening on @oarbank-conform-test-{proc.pid}"]
        assert sorted(x.kind for x in failing) == ["tcp6", "udp"]
        assert split_gpu_driver(held, gpu=False) == (held, [])
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_gpu_modules_refused_connect_is_its_drivers_and_nothing_else():
    from oarbank_sdk.conform.attempts import split_gpu_driver as split_attempts
    from oarbank_sdk.conform.attempts import summary
    from oarbank_sdk.sandbox._notify import Attempt

    tried = [Attempt(7, 7, "connect", "python3", "python3 -I svc.py serve"),
             Attempt(7, 7, "socket", "python3", "python3 -I svc.py serve", "AF_INET"),
             Attempt(7, 8, "connect", "python3", "python3 -I svc.py serve")]
    failing, driver = split_attempts(tried, gpu=True)
    assert [(a.syscall, a.family) for a in failing] == [("socket", "AF_INET")]
    assert summary(driver).startswith("2 attempt(s) refused by the sandbox: connect() x2 by pid 7")
    assert split_attempts(tried, gpu=False) == (tried, [])
