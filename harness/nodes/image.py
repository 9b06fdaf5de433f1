"""The node image for the container backend, built locally with no registry.

Two layers, each cached:
1. base  `oarbank-node-base:<release>-<key>`: `docker import` of the debootstrap tarball
   (harness.nodes.rootfs). Rebuilt only when the base recipe changes.
2. project  `oarbank-node:<release>-<srchash>`: a container of the base with the project's
   wheels bind-mounted read-only makes a venv in /opt/oarbank and pip-installs them with
   `--no-index` (the container has no network), then `docker commit`. Rebuilt when the
   sources of sdk/agent/ui-pages change; takes seconds.
Wheels are made on the host: ours with `pip wheel --no-deps`, the dependencies with
`pip download --only-binary=:all:` for the release's Python version and this machine's arch.
"""

from __future__ import annotations

import hashlib
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.nodes.buildenv import DISTS, REPO, build_python
from harness.nodes.cache import cache_dir
from harness.nodes.rootfs import ensure_rootfs

__all__ = ["REPO", "DISTS", "NodeImage", "source_hash", "ensure_base_image", "ensure_image"]

VENV = "/opt/oarbank"


@dataclass(frozen=True)
class NodeImage:
    release: str
    tag: str
    python: str
    base_built_s: float | None  # None: from cache
    project_built_s: float | None  # None: from cache


def _log(msg: str) -> None:
    print(f"[image] {msg}", file=sys.stderr, flush=True)


def source_hash(repo: Path = REPO) -> str:
    """A hash of every file that goes into the project wheels."""
    h = hashlib.sha256()
    for dist in DISTS:
        base = repo / dist
        files = [base / "pyproject.toml", *sorted((base / "src").rglob("*"))]
        for f in files:
            if not f.is_file() or "__pycache__" in f.parts or f.suffix == ".pyc" \
                    or any(p.endswith(".egg-info") for p in f.parts):
                continue
            h.update(str(f.relative_to(repo)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _platform_tags() -> list[str]:
    arch = platform.machine()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch.lower(), arch)
    tags = [f"manylinux_2_{m}_{arch}" for m in (36, 34, 31, 28, 27, 24, 17, 12, 5)]
    return [*tags, f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}",
            f"linux_{arch}"]


def _deps_hash(repo: Path = REPO) -> str:
    h = hashlib.sha256()
    for dist in DISTS:
        h.update((repo / dist / "pyproject.toml").read_bytes())
    return h.hexdigest()[:12]


def _wheels(python: str, srchash: str) -> tuple[Path, Path]:
    """(dependency wheels for `python`, our own wheels). Dependencies are cached by the
    pyproject files' hash, so a source change only rebuilds our three pure-Python wheels,
    offline, in the cached build venv (buildenv)."""
    root = cache_dir() / "wheels"
    pip = [sys.executable, "-m", "pip", "-q"]
    deps = root / f"deps-py{python}-{_deps_hash()}"
    ours = root / f"ours-{srchash}"
    if not (ours / ".done").is_file():
        shutil.rmtree(ours, ignore_errors=True)
        ours.mkdir(parents=True)
        # One cached build venv (buildenv: what our [build-system] tables require) instead of
        # an isolated build env per project: seconds instead of half a minute.
        bpy = build_python()
        subprocess.run([str(bpy), "-m", "pip", "-q", "wheel", "--no-deps",
                        "--no-build-isolation", "-w", str(ours),
                        *(str(REPO / d) for d in DISTS)], check=True)
        (ours / ".done").write_text("ok")
        for old in root.glob("ours-*"):  # earlier sources' wheels are never used again
            if old != ours:
                shutil.rmtree(old, ignore_errors=True)
    if not (deps / ".done").is_file():
        shutil.rmtree(deps, ignore_errors=True)
        deps.mkdir(parents=True)
        plat = [a for t in _platform_tags() for a in ("--platform", t)]
        nodot = python.replace(".", "")
        subprocess.run([*pip, "download", "--only-binary=:all:", "--python-version", python,
                        "--implementation", "cp", "--abi", f"cp{nodot}", "--abi", "abi3",
                        "--abi", "none", *plat, "-d", str(deps),
                        *sorted(str(p) for p in ours.glob("oarbank_*.whl"))], check=True)
        for p in deps.glob("oarbank_*.whl"):  # ours live in `ours`; keep one copy
            p.unlink()
        (deps / ".done").write_text("ok")
    return deps, ours


def _image_exists(client: Any, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _run_and_commit(client: Any, image: str, script: str, volumes: dict[str, str],
                    tag: str, what: str) -> None:
    """Run `script` in a network-less container of `image` with `volumes` (host -> container,
    read-only), and commit the result as `tag`."""
    ctr = client.containers.create(
        image, ["/bin/sh", "-c", script], network_mode="none",
        volumes={h: {"bind": c, "mode": "ro"} for h, c in volumes.items()},
        environment={"PIP_CONFIG_FILE": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    try:
        ctr.start()
        rc = ctr.wait(timeout=600)["StatusCode"]
        if rc != 0:
            logs = ctr.logs().decode(errors="replace")[-3000:]
            raise RuntimeError(f"{what} failed (exit {rc}):\n{logs}")
        repo, t = tag.split(":")
        ctr.commit(repository=repo, tag=t, changes=[
            f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            'CMD ["/bin/sh"]',
        ])
    finally:
        ctr.remove(force=True)


def _drop_older(client: Any, repo: str, prefix: str, keep: str) -> None:
    """Superseded layers of one release go, so the cache stays small. One that a container
    still uses (another harness run's node, on older sources) stays until a later build."""
    import docker

    for img in client.images.list(name=repo):
        for old in img.tags:
            if old.startswith(f"{repo}:{prefix}") and old != keep:
                try:
                    client.images.remove(old, noprune=False)
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:  # 409: in use by a container
                        raise
                    _log(f"kept {old}: a container still uses it")


def ensure_base_image(client: Any, release: str) -> tuple[str, str, float | None]:
    """(tag, python version, seconds spent building or None) of the bare Debian image of
    `release`: the debootstrap rootfs (python3, python3-venv, libseccomp2) imported as is."""
    base = ensure_rootfs(release)
    base_tag = f"oarbank-node-base:{release}-{base.key}"
    base_built: float | None = base.built_s
    if not _image_exists(client, base_tag):
        t0 = time.monotonic()
        repo, tag = base_tag.split(":")
        client.api.import_image_from_file(str(base.tarball), repository=repo, tag=tag)
        base_built = time.monotonic() - t0 + (base.built_s or 0.0)
        _log(f"imported {base_tag} in {time.monotonic() - t0:.0f}s")
    return base_tag, base.python, base_built


def ensure_image(client: Any, release: str) -> NodeImage:
    """The project image for `release`, building whichever layers are missing:
    base (debootstrap + import), deps (venv + third-party wheels), project (our wheels).
    One build at a time per cache (a file lock): two harness runs at once (parallel test
    workers, or a test run beside `nox -s e2e`) would otherwise remove each other's wheels."""
    import fcntl  # POSIX only, like the rest of the container backend

    with open(cache_dir() / "image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_image(client, release)


def _ensure_image(client: Any, release: str) -> NodeImage:
    base = ensure_rootfs(release)
    base_tag, _, base_built = ensure_base_image(client, release)

    srchash = source_hash()
    tag = f"oarbank-node:{release}-{srchash}"
    if _image_exists(client, tag):
        return NodeImage(release, tag, base.python, base_built, None)
    t0 = time.monotonic()
    deps, ours = _wheels(base.python, srchash)
    deps_tag = f"oarbank-node-deps:{release}-{base.key}-{deps.name.rsplit('-', 1)[-1]}"
    if not _image_exists(client, deps_tag):
        _run_and_commit(
            client, base_tag,
            f"set -e; python3 -m venv {VENV}; "
            f"{VENV}/bin/pip install -q --no-index --find-links /deps /deps/*.whl",
            {str(deps): "/deps"}, deps_tag, f"installing dependencies into {release}")
        _drop_older(client, "oarbank-node-deps", f"{release}-", deps_tag)
    _run_and_commit(
        client, deps_tag,
        f"set -e; {VENV}/bin/pip install -q --no-index --no-deps /wheels/*.whl; "
        f"{VENV}/bin/python -c 'import oarbank_sdk, oarbank_agent, oarbank_ui, psutil'",
        {str(ours): "/wheels"}, tag, f"installing the project into {release}")
    _drop_older(client, "oarbank-node", f"{release}-", tag)
    took = time.monotonic() - t0
    _log(f"built {tag} in {took:.0f}s")
    return NodeImage(release, tag, base.python, base_built, took)
