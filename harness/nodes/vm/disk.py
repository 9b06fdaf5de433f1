"""The VM node's disks, built locally from the container images' recipe and cached.

1. rootfs: `debootstrap --variant=minbase` of bookworm with the container images' packages
   plus Debian's kernel and systemd (harness.nodes.rootfs, its own cached tarball).
2. system image (`system-<release>-<key>.img`, raw ext4) and the kernel and initrd taken out
   of it: the rootfs extracted into a folder, the node set up in it (the agent's user and
   systemd unit, the harness's guest helper, fstab), then `mkfs.ext4 -d FOLDER` (no loop mount,
   so no mount can be left behind). Keyed by the rootfs and the guest files' content.
3. project image (`project-<release>-<key>.img`): /opt/oarbank (a venv with our wheels and
   their dependencies, `pip install --no-index` in a chroot of the same folder, from wheels
   made on the host) as a small ext4 image. Keyed by the sources' hash: a source change
   rebuilds only this one. The guest mounts it read-write, as a node's /opt is: an upgrade
   pip-installs a newer agent over it (VmNode.install_agent).
Each VM writes to qcow2 overlays of its own (one per disk); the cached images are never
written. One build
at a time per cache (a file lock, like the container images').
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.nodes.cache import cache_dir
from harness.nodes.image import REPO, _wheels, source_hash
from harness.nodes.rootfs import BaseRootfs, ensure_rootfs

__all__ = ["VM_PACKAGES", "AGENT_USER", "AGENT_UNIT", "AGENT_EXE", "STATE_DIR", "LOG_FILE",
           "NODE_DIR", "NodeDisks", "guest_files", "system_key", "project_key", "ensure_disks",
           "make_overlay"]

VM_PACKAGES = ("linux-image-amd64", "systemd-sysv", "udev", "kmod")
# Bump when the way the disks are made changes.
_RECIPE = "1"
AGENT_USER = "oarbank"
AGENT_UNIT = "oarbank-agent.service"
AGENT_EXE = "/opt/oarbank/venv/bin/oarbank-agent"
STATE_DIR = "/var/lib/oarbank-agent"  # the unit's StateDirectory=
LOG_FILE = "/var/log/oarbank-agent/agent.log"  # under its LogsDirectory=
NODE_DIR = "/node"  # the node's modules, settings and token, copied in by the harness
GUEST_HELPER = "/usr/local/lib/oarbank-harness/guest.py"
# Timers that would only compete with the scenarios for the emulated CPU (or reach for a
# network the node does not have).
MASKED = ("apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer",
          "dpkg-db-backup.timer", "e2scrub_reap.service", "systemd-journald-audit.socket")

HELPER_UNIT = f"""[Unit]
Description=oarbank harness helper: the control and portal ports (virtio serial)
DefaultDependencies=no
After=local-fs.target systemd-modules-load.service

[Service]
ExecStart=/usr/bin/python3 -I {GUEST_HELPER}
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
"""

# The agent's config file in the node: the log goes to a file the harness reads; everything
# else is a flag the harness gives in a drop-in of the project's unit (its ExecStart).
AGENT_TOML = f'log_file = "{LOG_FILE}"\n'

FSTAB = """/dev/vda / ext4 rw,errors=remount-ro 0 1
/dev/vdb /opt/oarbank ext4 rw 0 0
"""


@dataclass(frozen=True)
class NodeDisks:
    release: str
    system: Path  # raw ext4, read-only base of each VM's overlay
    project: Path  # raw ext4, read-only base of each VM's project overlay
    kernel: Path
    initrd: Path
    python: str
    rootfs_built_s: float | None  # None: from the cache
    system_built_s: float | None
    project_built_s: float | None


def _log(msg: str) -> None:
    print(f"[vm-image] {msg}", file=sys.stderr, flush=True)


def guest_files() -> dict[str, bytes]:
    """What the harness puts into the system image, by path in the guest."""
    here = Path(__file__).resolve().parent
    return {
        GUEST_HELPER: (here / "guest.py").read_bytes(),
        f"/etc/systemd/system/{AGENT_UNIT}":
            (REPO / "agent" / "systemd" / AGENT_UNIT).read_bytes(),
        "/etc/systemd/system/oarbank-harness-guest.service": HELPER_UNIT.encode(),
        "/etc/oarbank/agent.toml": AGENT_TOML.encode(),
        "/etc/modules-load.d/oarbank-harness.conf": b"virtio_console\n",
        "/etc/fstab": FSTAB.encode(),
    }


def system_key(rootfs_key: str, files: dict[str, bytes]) -> str:
    h = hashlib.sha256(f"{_RECIPE}|{rootfs_key}|{','.join(MASKED)}".encode())
    for path in sorted(files):
        h.update(path.encode() + b"\0" + files[path] + b"\0")
    return h.hexdigest()[:12]


def project_key(rootfs_key: str, deps_name: str, srchash: str) -> str:
    return hashlib.sha256(f"{_RECIPE}|{rootfs_key}|{deps_name}|{srchash}".encode()
                          ).hexdigest()[:12]


def _run(argv: list[str], what: str, **kw: object) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {r.returncode}): {' '.join(argv)}\n"
                           f"{(r.stdout + r.stderr)[-2000:]}")


def _mkfs(folder: Path, image: Path, label: str, spare_mib: int) -> None:
    """An ext4 image holding `folder` (owners and modes kept), `spare_mib` free."""
    used = int(subprocess.run(["du", "-sm", "--apparent-size", str(folder)],
                              capture_output=True, text=True, check=True).stdout.split()[0])
    size = (used * 13 // 10 + spare_mib)
    tmp = image.with_suffix(".part")
    tmp.unlink(missing_ok=True)
    _run(["mkfs.ext4", "-q", "-F", "-L", label, "-d", str(folder), str(tmp), f"{size}M"],
         f"mkfs.ext4 -d {folder}")
    tmp.replace(image)


def _set_up_system(work: Path, files: dict[str, bytes]) -> None:
    """The node as the agent README's "Run it on a node" sets one up (its user, the unit),
    plus the harness's helper."""
    _run(["chroot", str(work), "useradd", "--system", "--home-dir", STATE_DIR,
          "--shell", "/usr/sbin/nologin", AGENT_USER], "useradd in the node")
    for path, data in files.items():
        dest = work / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        dest.chmod(0o644)
    wants = work / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / "oarbank-harness-guest.service"
    link.unlink(missing_ok=True)
    link.symlink_to("/etc/systemd/system/oarbank-harness-guest.service")
    for unit in MASKED:
        m = work / "etc/systemd/system" / unit
        m.unlink(missing_ok=True)
        m.symlink_to("/dev/null")
    for d in ("opt/oarbank", NODE_DIR.lstrip("/")):
        (work / d).mkdir(parents=True, exist_ok=True)
        (work / d).chmod(0o755)


def _stage_wheels(python: str, srchash: str, stage: Path) -> str:
    """Copy the project's wheels (harness.nodes.image's, made on the host) into `stage`; the name
    of the dependencies' set. Under the container images' lock: a build of theirs may
    replace the wheels of older sources meanwhile."""
    import fcntl

    with open(cache_dir() / "image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        deps, ours = _wheels(python, srchash)
        shutil.rmtree(stage, ignore_errors=True)
        shutil.copytree(deps, stage / "deps")
        shutil.copytree(ours, stage / "ours")
    return deps.name


def _install_project(work: Path, staged: Path) -> None:
    """/opt/oarbank/venv in a chroot of the node's root, offline, from the staged wheels."""
    stage = work / "tmp" / "oarbank-wheels"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(staged, stage)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "PIP_CONFIG_FILE": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_INDEX": "1"}
    _run(["chroot", str(work), "python3", "-m", "venv", "/opt/oarbank/venv"],
         "python3 -m venv in the node", env=env)
    wheels = [f"/tmp/oarbank-wheels/{d}/{p.name}" for d in ("deps", "ours")
              for p in sorted((stage / d).glob("*.whl"))]
    _run(["chroot", str(work), "/opt/oarbank/venv/bin/pip", "install", "-q", "--no-index",
          "--find-links", "/tmp/oarbank-wheels/deps", *wheels],
         "pip install in the node", env=env)
    _run(["chroot", str(work), "/opt/oarbank/venv/bin/python", "-c",
          "import oarbank_sdk, oarbank_agent, psutil"], "importing the project in the node",
         env=env)
    shutil.rmtree(stage)


def ensure_disks(release: str = "bookworm") -> NodeDisks:
    """The cached disks of a `release` node, building whichever are missing (see the module
    doc). One build at a time per cache."""
    import fcntl

    with open(cache_dir() / "vm-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_disks(release)


def _ensure_disks(release: str) -> NodeDisks:
    rootfs = ensure_rootfs(release, extra=VM_PACKAGES, name="-vm")
    files = guest_files()
    skey = system_key(rootfs.key, files)
    srchash = source_hash()
    out = cache_dir() / "vm"
    out.mkdir(exist_ok=True)
    work = out / f"build-{os.getpid()}"
    staged = out / f"build-{os.getpid()}-wheels"
    for d in (work, staged):
        shutil.rmtree(d, ignore_errors=True)
    try:
        deps_name = _stage_wheels(rootfs.python, srchash, staged)
        return _build(release, rootfs, files, skey, project_key(rootfs.key, deps_name, srchash),
                      work, staged)
    finally:
        for d in (work, staged):
            shutil.rmtree(d, ignore_errors=True)


def _build(release: str, rootfs: BaseRootfs, files: dict[str, bytes], skey: str, pkey: str,
           work: Path, staged: Path) -> NodeDisks:
    out = work.parent
    system = out / f"system-{release}-{skey}.img"
    kernel = out / f"vmlinuz-{release}-{skey}"
    initrd = out / f"initrd-{release}-{skey}.img"
    project = out / f"project-{release}-{pkey}.img"
    built: dict[str, float | None] = {"system": None, "project": None}
    need_system = not (system.is_file() and kernel.is_file() and initrd.is_file())
    if need_system or not project.is_file():
        work.mkdir()
        t0 = time.monotonic()
        _run(["tar", "-xpf", str(rootfs.tarball), "--numeric-owner", "-C", str(work)],
             "extracting the rootfs")
        if need_system:
            _set_up_system(work, files)
            kernels = sorted((work / "boot").glob("vmlinuz-*"))
            initrds = sorted((work / "boot").glob("initrd.img-*"))
            if not kernels or not initrds:
                raise RuntimeError(f"no kernel or initrd in the rootfs's /boot: "
                                   f"{sorted(p.name for p in (work / 'boot').iterdir())}")
            shutil.copyfile(kernels[-1], kernel)
            shutil.copyfile(initrds[-1], initrd)
            _mkfs(work, system, "oarbank-system", 1536)
            built["system"] = time.monotonic() - t0
            _log(f"system image {system.name} in {built['system']:.0f}s")
        if not project.is_file():
            t1 = time.monotonic()
            _install_project(work, staged)
            _mkfs(work / "opt" / "oarbank", project, "oarbank-proj", 64)
            built["project"] = time.monotonic() - t1
            _log(f"project image {project.name} in {built['project']:.0f}s")
    keep = {system.name, kernel.name, initrd.name, project.name}
    for old in out.glob(f"*-{release}-*"):  # superseded disks are never used again
        if old.name not in keep and not old.name.startswith("build-"):
            old.unlink(missing_ok=True)
    return NodeDisks(release, system, project, kernel, initrd, rootfs.python, rootfs.built_s,
                     built["system"], built["project"])


def make_overlay(base: Path, overlay: Path) -> None:
    """A qcow2 file holding one VM's writes over the cached `base` (never written)."""
    _run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(base),
          str(overlay)], "qemu-img create")
