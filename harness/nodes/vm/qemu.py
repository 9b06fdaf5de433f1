"""QEMU for the VM backend: which accelerator works here, the command line, one VM's process.

KVM is used when it works. `/dev/kvm` existing is not enough: where nested virtualisation is
broken a KVM guest hangs before its kernel prints anything. So the first use on each boot of
this machine (the choice is cached by /proc/sys/kernel/random/boot_id) boots the node kernel
under KVM with no disk and waits for its first console line; without one, TCG (emulation,
slower) is used. `OARBANK_HARNESS_VM_ACCEL=kvm|tcg` skips the probe.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.nodes.cache import cache_dir

__all__ = ["QEMU", "ACCELS", "VmSpec", "unavailable", "qemu_argv", "kernel_cmdline",
           "choose_accel", "accel_for_this_boot", "probe_kvm"]

QEMU = "qemu-system-x86_64"
ACCELS = ("kvm", "tcg")
ACCEL_ENV = "OARBANK_HARNESS_VM_ACCEL"
KVM_PROBE_S = 20.0  # a working KVM prints the kernel's first line in well under a second


def unavailable() -> str | None:
    """Why no VM can run here, or None."""
    if platform.machine() not in ("x86_64", "AMD64", "amd64"):
        return f"the VM backend boots amd64 guests; this machine is {platform.machine()}"
    for tool in (QEMU, "qemu-img"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install qemu-system-x86 qemu-utils)"
    if shutil.which("debootstrap") is None or shutil.which("mkfs.ext4") is None:
        return "debootstrap and mkfs.ext4 build the node disk (apt-get install debootstrap)"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "building the node disk (debootstrap, chroot) needs root"
    return None


@dataclass(frozen=True)
class VmSpec:
    """One VM: what it boots and where its host-side files go."""
    kernel: Path
    initrd: Path
    system_disk: Path  # a qcow2 overlay of the cached system image (this run's writes)
    project_disk: Path  # a qcow2 overlay of the cached project image (an upgrade's writes)
    control_socket: Path  # QEMU serves the control port here
    portal_socket: Path  # ... and the portal port here
    console_log: Path
    hostname: str
    accel: str = "tcg"
    memory_mib: int = 3072
    cpus: int = 2


def kernel_cmdline(hostname: str) -> str:
    """Root on the first disk, the console on the serial port (a file on the host), the
    node's host name, and no reboot loop if the kernel panics. No CPU side-channel
    mitigations: the guest runs only the harness's own code, and under TCG page-table
    isolation's TLB flushes on every system call dominate (kernel boot 44 s -> 18 s here)."""
    if not hostname or any(c.isspace() for c in hostname):
        raise ValueError(f"bad host name {hostname!r}")
    return (f"root=/dev/vda rw console=ttyS0 panic=-1 systemd.hostname={hostname} "
            "systemd.show_status=false loglevel=4 mitigations=off")


def qemu_argv(spec: VmSpec) -> list[str]:
    """The command line of one node: no NIC, the two disks on virtio, the two virtio serial
    ports as unix sockets QEMU serves, the console to a file, nothing listening anywhere."""
    if spec.accel not in ACCELS:
        raise ValueError(f"unknown accelerator {spec.accel!r} (one of {', '.join(ACCELS)})")
    for sock in (spec.control_socket, spec.portal_socket):
        if "," in str(sock):
            raise ValueError(f"a QEMU option value cannot hold a comma: {sock}")
    # Under TCG a plain CPU model: with `max` the guest's libc and kernel pick instructions
    # and mitigations that cost far more to emulate (Python starts measured 3-5x slower).
    cpu = "host" if spec.accel == "kvm" else "qemu64"
    argv = [
        QEMU, "-name", spec.hostname, "-machine", f"pc,accel={spec.accel}", "-cpu", cpu,
        "-smp", str(spec.cpus), "-m", str(spec.memory_mib),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-nic", "none",
        "-serial", f"file:{spec.console_log}",
        "-kernel", str(spec.kernel), "-initrd", str(spec.initrd),
        "-append", kernel_cmdline(spec.hostname),
        "-drive", f"file={spec.system_disk},format=qcow2,if=virtio,cache=unsafe",
        "-drive", f"file={spec.project_disk},format=qcow2,if=virtio,cache=unsafe",
        "-device", "virtio-serial-pci",
    ]
    for cid, path, name in (("control", spec.control_socket, "oarbank.control"),
                            ("portal", spec.portal_socket, "oarbank.portal")):
        argv += ["-chardev", f"socket,id={cid},path={path},server=on,wait=off",
                 "-device", f"virtserialport,chardev={cid},name={name}"]
    return argv


def choose_accel(env_value: str | None, kvm_device: bool, cached: str | None,
                 probe: object) -> tuple[str, str]:
    """(accelerator, why). `probe` is called (it returns True when a KVM guest ran) only when
    nothing else decides: no override, /dev/kvm usable, no result for this boot yet."""
    if env_value:
        if env_value not in ACCELS:
            raise ValueError(f"{ACCEL_ENV}={env_value!r}: one of {', '.join(ACCELS)}")
        return env_value, f"{ACCEL_ENV}={env_value}"
    if not kvm_device:
        return "tcg", "no usable /dev/kvm"
    if cached in ACCELS:
        return cached, "probed earlier on this boot of the machine"
    assert callable(probe)
    if probe():
        return "kvm", "a KVM guest printed its first kernel line"
    return "tcg", (f"/dev/kvm exists but a KVM guest printed nothing in {KVM_PROBE_S:g} s "
                   "(no nested virtualisation here)")


def probe_kvm(kernel: Path) -> bool:
    """Boot `kernel` under KVM with no disk; True when it prints on the console in time."""
    with tempfile.TemporaryDirectory(prefix="oarbank-kvm-probe-") as tmp:
        console = Path(tmp) / "console.log"
        argv = [QEMU, "-machine", "pc,accel=kvm", "-cpu", "host", "-m", "256", "-nodefaults",
                "-no-user-config", "-display", "none", "-no-reboot", "-nic", "none",
                "-serial", f"file:{console}", "-kernel", str(kernel),
                "-append", "console=ttyS0 panic=-1 earlyprintk=serial"]
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + KVM_PROBE_S
            while time.monotonic() < deadline and p.poll() is None:
                if console.exists() and b"Linux version" in console.read_bytes():
                    return True
                time.sleep(0.2)
            return False
        finally:
            p.kill()
            p.wait(30)


def accel_for_this_boot(kernel: Path) -> tuple[str, str]:
    """The accelerator to use and why (probing KVM once per boot of this machine)."""
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    cache = cache_dir() / "vm-accel.json"
    cached = None
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(cache.read_text())
        if data.get("boot_id") == boot_id:
            cached = data.get("accel")
    kvm = os.access("/dev/kvm", os.R_OK | os.W_OK)
    accel, why = choose_accel(os.environ.get(ACCEL_ENV), kvm, cached,
                              lambda: probe_kvm(kernel))
    if kvm and not os.environ.get(ACCEL_ENV) and cached is None:
        cache.write_text(json.dumps({"boot_id": boot_id, "accel": accel}))
    return accel, why
