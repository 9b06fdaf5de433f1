"""Step 1 of the node image: a minimal Debian root filesystem, cached as a tarball.

`debootstrap --variant=minbase` from the mirror this machine's apt uses (harness.nodes.aptsources),
plus python3, python3-venv and libseccomp2 (the agent's sandbox loads it with ctypes). The
tarball is keyed by release and a hash of what goes in, so it is built once per machine and
reused until the package list changes. Building needs root and network to the mirror; nothing
here needs Docker.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.nodes import aptsources
from harness.nodes.cache import cache_dir

__all__ = ["RELEASES", "BASE_PACKAGES", "BaseRootfs", "ensure_rootfs"]

RELEASES = ("bookworm", "trixie")
BASE_PACKAGES = ("python3", "python3-venv", "libseccomp2")
# Bump when the way the rootfs is made changes, so old tarballs are not reused.
_RECIPE = "1"


@dataclass(frozen=True)
class BaseRootfs:
    release: str
    tarball: Path
    python: str  # "3.11": the release's python3, which decides which wheels fit
    key: str  # content key of the tarball: names the Docker base image
    built_s: float | None  # seconds spent building now; None when it came from the cache


def _key(release: str, extra: tuple[str, ...] = ()) -> str:
    packages = ",".join(BASE_PACKAGES + extra)
    h = hashlib.sha256(f"{_RECIPE}|{release}|{packages}".encode())
    return h.hexdigest()[:12]


def _log(msg: str) -> None:
    print(f"[image] {msg}", file=sys.stderr, flush=True)


def ensure_rootfs(release: str, *, mirror: str | None = None,
                  extra: tuple[str, ...] = (), name: str = "") -> BaseRootfs:
    """The cached base tarball for `release`, building it first if it is missing. `extra`:
    packages on top of the base ones (the VM backend's kernel and systemd), in a tarball of
    their own named `<release><name>-<key>`."""
    if release not in RELEASES:
        raise ValueError(f"unknown release {release!r}; known: {', '.join(RELEASES)}")
    key = _key(release, extra)
    root = cache_dir() / "rootfs"
    root.mkdir(exist_ok=True)
    tarball = root / f"{release}{name}-{key}.tar"
    meta_file = root / f"{release}{name}-{key}.json"
    if tarball.is_file() and meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        return BaseRootfs(release, tarball, meta["python"], key, None)

    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (apt-get install debootstrap)")
    mirror = mirror or aptsources.debian_mirror(aptsources.read_sources())
    work = root / f"{release}{name}-{key}.build-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.monotonic()
    _log(f"debootstrap {release} from the machine's apt mirror (minutes)")
    try:
        argv = [
            "debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES + extra)}",
            release, str(work), mirror,
        ]
        keyring = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
        if keyring.is_file():
            argv.insert(1, f"--keyring={keyring}")
        log = root / f"{release}{name}-debootstrap.log"
        with open(log, "wb") as out:
            rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"debootstrap {release} failed (exit {rc}); log {log}:\n{tail}")
        python = subprocess.run(
            ["chroot", str(work), "python3", "-c",
             "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        # What a container never needs: downloaded .debs and package lists.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (work / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        tmp = tarball.with_suffix(".tar.part")
        with tarfile.open(tmp, "w") as tf:
            for entry in sorted(os.listdir(work)):
                tf.add(work / entry, arcname=entry)
        tmp.replace(tarball)
        meta_file.write_text(json.dumps({"python": python, "release": release}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    took = time.monotonic() - t0
    _log(f"rootfs {release} ready in {took:.0f}s (python {python})")
    return BaseRootfs(release, tarball, python, key, took)


if __name__ == "__main__":  # python -m harness.nodes.rootfs bookworm trixie: warm the cache
    for rel in sys.argv[1:] or RELEASES:
        r = ensure_rootfs(rel)
        print(json.dumps({"release": r.release, "tarball": str(r.tarball), "python": r.python,
                          "built_s": r.built_s}))
