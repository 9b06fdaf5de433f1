"""One running VM: its QEMU process, its overlay disks, and the host ends of its ports.

`Machine.boot` starts QEMU and returns once the guest helper has said hello (the guest's
systemd is up, its disks mounted). `stop` asks the guest to power off, then ends QEMU if it
has not gone, and removes the overlays and the sockets: nothing of the VM stays behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.nodes import procs
from harness.nodes.vm.channel import ChannelError, Control, PortalForward, connect_unix
from harness.nodes.vm.disk import NodeDisks, make_overlay
from harness.nodes.vm.qemu import VmSpec, qemu_argv

__all__ = ["Machine", "BOOT_WAIT_S", "BOOT_TRIES", "kernel_stall"]

_PR_SET_PDEATHSIG = 1
BOOT_WAIT_S = 600.0  # TCG on a loaded machine: far more than the ~30 s it takes alone
# A guest kernel that locked up while booting (seen under TCG: "soft lockup - CPU#1 stuck for
# 480s" from systemd) never comes back: it is booted once more, on fresh overlays, at once.
# Nothing of the project has run in it yet, so this hides no failure of the code under test.
BOOT_TRIES = 2
_STALLS = ("soft lockup", "rcu_preempt detected stalls", "rcu_sched detected stalls",
           "hung_task_timeout")


def kernel_stall(console: str) -> str | None:
    """The guest kernel's own word that it locked up, from its console; None if it did not."""
    for line in console.splitlines():
        if any(s in line for s in _STALLS):
            return f"the guest kernel locked up while booting: {line.strip()[:200]}"
    return None


def _die_with_parent() -> None:
    """In QEMU's child before exec: SIGKILL when the harness dies, even by SIGKILL (its
    own session keeps Ctrl-C for the harness, which stops every VM on its way out)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _KernelStalled(ChannelError):
    """The boot failed because the guest kernel locked up (``kernel_stall``)."""


@dataclass
class Machine:
    folder: Path  # the node's vm/ folder: sockets, overlays, console log
    spec: VmSpec
    proc: subprocess.Popen[bytes] | None = None
    control: Control | None = None
    portal: PortalForward | None = None
    hello: dict[str, Any] = field(default_factory=dict)
    boot_s: float = 0.0

    @classmethod
    def boot(cls, folder: Path, disks: NodeDisks, hostname: str, accel: str,
             portal_socket: Path | None, memory_mib: int = 3072) -> Machine:
        """Start the VM; booted again (up to BOOT_TRIES in all) when its kernel locked up."""
        for attempt in range(1, BOOT_TRIES + 1):
            try:
                return cls._boot_once(folder, disks, hostname, accel, portal_socket,
                                      memory_mib)
            except _KernelStalled as exc:
                if attempt == BOOT_TRIES:
                    raise
                print(f"harness: {exc}; booting {hostname} again", flush=True)
        raise AssertionError("unreachable")

    @classmethod
    def _boot_once(cls, folder: Path, disks: NodeDisks, hostname: str, accel: str,
                   portal_socket: Path | None, memory_mib: int) -> Machine:
        folder.mkdir(parents=True, exist_ok=True)
        spec = VmSpec(kernel=disks.kernel, initrd=disks.initrd,
                      system_disk=folder / "system.qcow2",
                      project_disk=folder / "project.qcow2",
                      control_socket=folder / "control.sock",
                      portal_socket=folder / "portal.sock", console_log=folder / "console.log",
                      hostname=hostname, accel=accel, memory_mib=memory_mib)
        m = cls(folder, spec)
        t0 = time.monotonic()
        make_overlay(disks.system, spec.system_disk)
        try:
            make_overlay(disks.project, spec.project_disk)
        except Exception:
            spec.system_disk.unlink(missing_ok=True)
            raise
        with open(folder / "qemu.log", "ab") as log:
            m.proc = subprocess.Popen(qemu_argv(spec), stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      preexec_fn=_die_with_parent)
        procs.OWNED.add(m.proc.pid)
        try:
            m.control = Control(connect_unix(spec.control_socket, 60))
            m.portal = PortalForward(connect_unix(spec.portal_socket, 60), portal_socket)
            m.hello = (m.control.wait_hello(
                BOOT_WAIT_S, lambda: kernel_stall(m.console_tail(1 << 16)))
                if m.alive() else {})
            if not m.hello:
                raise ChannelError("QEMU exited during boot")
        except Exception as exc:
            tail = m.console_tail()
            stall = kernel_stall(m.console_tail(1 << 16))
            m.stop(grace_s=0.0 if stall else 30.0)
            error = (f"the VM {hostname} did not boot: {exc}; console: {tail}; "
                     f"qemu: {m.qemu_log_tail()}")
            raise (_KernelStalled(error) if stall else ChannelError(error)) from exc
        m.boot_s = time.monotonic() - t0
        return m

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def console_tail(self, n: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return self.spec.console_log.read_text(errors="replace")[-n:]
        return "(no console output)"

    def qemu_log_tail(self, n: int = 800) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / "qemu.log").read_text(errors="replace")[-n:]
        return ""

    def stop(self, grace_s: float = 30.0) -> None:
        """Power the guest off (its agent stopped first, as systemd stops units), then make
        sure QEMU is gone; remove the overlays and sockets. Idempotent."""
        if self.control is not None and self.alive():
            with contextlib.suppress(ChannelError, OSError):
                self.control.request("exec", 10, argv=["systemctl", "--no-block", "poweroff"],
                                     timeout_s=5)
        if self.proc is not None:
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
            procs.OWNED.discard(self.proc.pid)
        for ch in (self.control, self.portal):
            if ch is not None:
                with contextlib.suppress(OSError):
                    ch.close()
        self.control = self.portal = None
        for f in (self.spec.system_disk, self.spec.project_disk, self.spec.control_socket,
                  self.spec.portal_socket):
            f.unlink(missing_ok=True)
