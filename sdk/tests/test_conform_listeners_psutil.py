"""The conformance kit's "never listens" check as macOS runs it: psutil's per-process
connections (``listeners._psutil_listeners``), called here on Linux too and compared with the
``/proc/<pid>/net`` reading on the same real sockets of another process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from platform_marks import conform_kit  # sdk/tests

from oarbank_sdk.conform import listeners as kit

_HOLDER = r"""
import os, socket, sys, time
d = sys.argv[1]
held = []
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); held.append(s)
t = socket.socket(socket.AF_INET6); t.bind(("::1", 0)); t.listen(); held.append(t)
t4 = socket.socket(); t4.bind(("127.0.0.1", 0)); t4.listen(); held.append(t4)
p = socket.socket(socket.AF_UNIX); p.bind(d + "/l.sock"); p.listen(); held.append(p)
g = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); g.bind(d + "/g.sock"); held.append(g)
# not listening: a TCP and a unix connection both ways, a connected and an unbound UDP
# socket, a socketpair, a TCP socket never bound
c4 = socket.create_connection(t4.getsockname()); held += [c4, t4.accept()[0]]
cu = socket.socket(socket.AF_UNIX); cu.connect(d + "/l.sock"); held += [cu, p.accept()[0]]
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.connect(("127.0.0.1", 9)); held.append(c)
held.append(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
held.extend(socket.socketpair()); held.append(socket.socket())
print("ready", s.getsockname()[1], t.getsockname()[1], t4.getsockname()[1], flush=True)
time.sleep(60)
"""


pytestmark = conform_kit


@pytest.fixture
def holder(tmp_path: Path):
    short = Path("/tmp") if len(str(tmp_path)) > 80 else tmp_path  # sun_path: 104 bytes on macOS
    d = short / f"lst-{tmp_path.name[-12:]}"
    d.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(d)], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        ports = proc.stdout.readline().split()[1:]
        yield proc.pid, d, ports
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        for f in ("l.sock", "g.sock"):
            (d / f).unlink(missing_ok=True)
        d.rmdir()


def test_psutil_path_sees_tcp_udp_and_named_unix_sockets(holder):
    pid, d, (udp, tcp6, tcp4) = holder
    found = sorted(str(x) for x in kit._psutil_listeners({pid}))
    assert found == sorted([
        f"pid {pid}: UDP bound 127.0.0.1:{udp}",
        f"pid {pid}: TCP listening on [::1]:{tcp6}",
        f"pid {pid}: TCP listening on 127.0.0.1:{tcp4}",
        f"pid {pid}: unix listening on {d}/l.sock",  # once, though accepted on too
        f"pid {pid}: unix listening on {d}/g.sock",
    ])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="linux only: /proc/<pid>/net")
def test_psutil_path_agrees_with_the_proc_reading(holder):
    pid, _, _ = holder
    assert sorted(map(str, kit._psutil_listeners({pid}))) == sorted(
        map(str, kit._linux_listeners({pid})))


def test_listeners_takes_the_psutil_path_off_linux(holder, monkeypatch):
    pid, _, _ = holder
    monkeypatch.setattr(kit, "_reads_proc", lambda: False)  # as on macOS
    seen = []
    monkeypatch.setattr(kit, "_linux_listeners", lambda pids: seen.append(pids) or [])
    assert len(kit.listeners({pid})) == 5
    assert seen == []
