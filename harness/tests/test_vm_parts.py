"""The VM backend's pure parts: QEMU's command line, the accelerator choice, a guest kernel's
lockup read from its console, the unit's drop-in, path mapping, exit codes, the disks' cache
keys, and the portal port's frames (over a real socket pair)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from harness.nodes.backends import make_backends
from harness.nodes.backends.vm import drop_in, exec_start, exit_code, node_path
from harness.nodes.vm import guest
from harness.nodes.vm.disk import project_key, system_key
from harness.nodes.vm.machine import kernel_stall
from harness.nodes.vm.qemu import VmSpec, choose_accel, kernel_cmdline, qemu_argv


def _spec(tmp: Path, accel: str = "tcg") -> VmSpec:
    return VmSpec(kernel=tmp / "vmlinuz", initrd=tmp / "initrd", system_disk=tmp / "s.qcow2",
                  project_disk=tmp / "p.qcow2", control_socket=tmp / "c.sock",
                  portal_socket=tmp / "p.sock", console_log=tmp / "console.log",
                  hostname="node-1", accel=accel)


def test_qemu_argv_has_no_network_and_serves_both_ports_on_unix_sockets(tmp_path: Path) -> None:
    argv = qemu_argv(_spec(tmp_path))
    joined = " ".join(argv)
    assert argv[argv.index("-nic") + 1] == "none"
    assert "-netdev" not in argv and "hostfwd" not in joined and "tcp:" not in joined
    assert f"socket,id=control,path={tmp_path}/c.sock,server=on,wait=off" in argv
    assert "virtserialport,chardev=control,name=oarbank.control" in argv
    assert "virtserialport,chardev=portal,name=oarbank.portal" in argv
    assert f"file={tmp_path}/p.qcow2,format=qcow2,if=virtio,cache=unsafe" in argv
    assert argv[argv.index("-machine") + 1] == "pc,accel=tcg"
    assert argv[argv.index("-cpu") + 1] == "qemu64"
    assert "systemd.hostname=node-1" in argv[argv.index("-append") + 1]
    kvm = qemu_argv(_spec(tmp_path, "kvm"))
    assert kvm[kvm.index("-machine") + 1] == "pc,accel=kvm"
    assert kvm[kvm.index("-cpu") + 1] == "host"


def test_qemu_argv_refuses_what_it_cannot_say(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown accelerator 'hvf'"):
        qemu_argv(_spec(tmp_path, "hvf"))
    with pytest.raises(ValueError, match="cannot hold a comma"):
        qemu_argv(_spec(tmp_path / "a,b"))
    with pytest.raises(ValueError, match="bad host name"):
        kernel_cmdline("two words")


def test_accel_choice() -> None:
    def never() -> bool:
        raise AssertionError("probed when something else decides")

    assert choose_accel("tcg", True, None, never) == ("tcg", "OARBANK_HARNESS_VM_ACCEL=tcg")
    assert choose_accel(None, False, None, never) == ("tcg", "no usable /dev/kvm")
    assert choose_accel(None, True, "kvm", never)[0] == "kvm"
    assert choose_accel(None, True, None, lambda: True)[0] == "kvm"
    accel, why = choose_accel(None, True, None, lambda: False)
    assert accel == "tcg" and "no nested virtualisation" in why
    with pytest.raises(ValueError, match="OARBANK_HARNESS_VM_ACCEL='xen'"):
        choose_accel("xen", True, None, never)


def test_drop_in_replaces_exec_start_and_expands_nothing() -> None:
    text = drop_in(["run", "--node-id", "a b", "--payload", '50% "$HOME" \\x'])
    lines = text.splitlines()
    assert lines[:2] == ["[Service]", "ExecStart="]
    assert lines[2] == ('ExecStart="/opt/oarbank/venv/bin/oarbank-agent" "run" "--config" '
                        '"/etc/oarbank/agent.toml" "--node-id" "a b" "--payload" '
                        '"50%% \\"$$HOME\\" \\\\x"')
    with pytest.raises(ValueError, match="line break"):
        exec_start(["run", "a\nb"])


def test_node_paths(tmp_path: Path) -> None:
    root = tmp_path / "n1"
    assert node_path(root, root / "state") == "/var/lib/oarbank-agent"
    assert node_path(root, root / "state" / "jobs" / "x") == "/var/lib/oarbank-agent/jobs/x"
    assert node_path(root, root / "modules" / "echo") == "/node/modules/echo"
    assert node_path(root, root / "portal.token") == "/node/portal.token"
    with pytest.raises(ValueError):
        node_path(root, tmp_path / "elsewhere")


def test_exit_code_from_systemctl_show() -> None:
    assert exit_code({"ExecMainCode": "1", "ExecMainStatus": "0"}) == 0
    assert exit_code({"ExecMainCode": "1", "ExecMainStatus": "2"}) == 2
    assert exit_code({"ExecMainCode": "2", "ExecMainStatus": "9"}) == -9
    assert exit_code({"ExecMainCode": "0", "ExecMainStatus": "0"}) is None
    assert exit_code({}) is None


def test_cache_keys_follow_content() -> None:
    files = {"/a": b"1", "/b": b"2"}
    k = system_key("root1", files)
    assert system_key("root1", dict(reversed(files.items()))) == k  # order does not matter
    assert system_key("root2", files) != k
    assert system_key("root1", {**files, "/b": b"3"}) != k
    p = project_key("root1", "deps-py3.11-abc", "src1")
    assert p != project_key("root1", "deps-py3.11-abc", "src2")
    assert p != project_key("root1", "deps-py3.11-def", "src1")


def test_vm_backend_is_opt_in() -> None:
    assert [b.name for b in make_backends(None)] == ["local", "container:bookworm",
                                                     "container:trixie"]
    assert [b.name for b in make_backends("vm")] == ["vm:bookworm"]
    with pytest.raises(ValueError, match="unknown backend 'vm:sid'"):
        make_backends("vm:sid")


def test_frames_survive_any_split() -> None:
    stream = (guest.encode(1, guest.OPEN) + guest.encode(1, guest.DATA, b"hello")
              + guest.encode(7, guest.EOF) + guest.encode(1, guest.CLOSE))
    want = [(1, guest.OPEN, b""), (1, guest.DATA, b"hello"), (7, guest.EOF, b""),
            (1, guest.CLOSE, b"")]
    for step in (1, 3, 9, len(stream)):
        dec = guest.Decoder()
        got = []
        for i in range(0, len(stream), step):
            got += dec.feed(stream[i:i + step])
        assert got == want
    with pytest.raises(ValueError, match="bad frame header"):
        guest.Decoder().feed(b"\0\0\0\1\x09\0\0\0\0")
    with pytest.raises(ValueError, match="at most"):
        guest.encode(1, guest.DATA, b"x" * (guest.MAX_PAYLOAD + 1))


def test_mux_carries_connections_both_ways(tmp_path: Path) -> None:
    """The two ends of the portal port over a socket pair standing in for the virtio serial
    port: a client connecting on the "guest" side reaches a real unix server on the "host"
    side, both directions and the half-close (HTTP's end of request) come through."""
    server_path = tmp_path / "portal.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(server_path))
    server.listen(4)

    def serve() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            with conn:
                data = b""
                while chunk := conn.recv(4096):
                    data += chunk
                conn.sendall(b"echo:" + data)

    served = threading.Thread(target=serve)
    served.start()
    g_end, h_end = socket.socketpair()

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(server_path))
        return s

    guest_mux = guest.Mux(g_end.recv, g_end.sendall)
    host_mux = guest.Mux(h_end.recv, h_end.sendall, connect)
    runs = [threading.Thread(target=m.run) for m in (guest_mux, host_mux)]
    for t in runs:
        t.start()
    try:
        for payload in (b"GET / HTTP/1.1\r\n\r\n", b"y" * 200_000):
            a, b = socket.socketpair()
            guest_mux.add(b)  # the agent's connection, as accepted in the guest
            a.sendall(payload)
            a.shutdown(socket.SHUT_WR)
            got = b""
            while chunk := a.recv(65536):
                got += chunk
            a.close()
            assert got == b"echo:" + payload
    finally:
        served.join(30)
        for s in (g_end, h_end):
            s.shutdown(socket.SHUT_RDWR)
        for t in runs:
            t.join(30)
        g_end.close()
        h_end.close()
        server.close()
    assert not served.is_alive() and not any(t.is_alive() for t in runs)


def test_a_guest_kernel_that_locked_up_is_read_from_its_console() -> None:
    # the console of CI's listener-refused boot under TCG (2026-12-07), shortened
    console = ("[    2.1] systemd[1]: Detected virtualization qemu.\n"
               "[  509.9] watchdog: BUG: soft lockup - CPU#1 stuck for 480s! [systemd:1]\n"
               "[  533.9] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:\n")
    why = kernel_stall(console)
    assert why is not None and "soft lockup - CPU#1 stuck for 480s" in why
    assert kernel_stall("[    2.1] systemd[1]: Detected virtualization qemu.\n"
                        "[   18.0] oarbank-guest: hello\n") is None
