"""Module environments (contract section 4): each ``requirements.txt`` a module's ``exec`` uses,
installed once per node, offline, into ``<state>/envs/<digest>/``.

The digest covers the interpreter (its path, version and site folders), the file's bytes and the sha256 of
every wheel in the bundle that serves one of its pins: modules with identical pins and wheels
share one environment; one module's pins never change another's. Building it is two children of
the agent (their argv and environment are the SDK's, ``manifest/requirements.py``: ``conform``
installs the same way), each started like an op (``procs.spawn``: its own group, inside the sandbox launcher,
reading the bundle, writing only the new environment, no network):

1. ``<host python> -I -m venv --system-site-packages --without-pip <env>``. When the host's
   interpreter is itself a venv that does not see the base installation's site folder (the
   usual agent install), ``--system-site-packages`` is left out: the environment sees what the
   host sees and no more (with it, a base's ``.pth`` files would run in every module process,
   56 ms a start on the machine measured, and its packages would be importable);
2. ``<env python> -I -c <boot> <host pip's folder> install --no-index --find-links
   <bundle>/wheels --require-hashes --only-binary :all: --no-deps --ignore-installed -r
   <requirements>`` with no pip config (``PIP_CONFIG_FILE`` is the null device) and no cache:
   pip sees the environment and its own folder, and makes no socket (the SDK's
   ``requirements.PIP_BOOT`` says why);
3. a ``.pth`` file (written by the agent) that adds the host's own site folders after the
   environment's: the SDK and its closure are the host's, a pinned copy in the environment
   comes first.

Only then is ``.ready`` written: a folder without it is a torn build, removed and built again.
Concurrent loads of one digest await one build. A failed build is removed and its reason (pip's
``ERROR:`` lines, a missing wheel named) refuses the module. ``sweep`` removes an environment no
loaded module uses once it has been unused for ``grace_s``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path

from oarbank_agent import procs
from oarbank_agent.eventwait import result_within
from oarbank_agent.sandbox import policy as sandboxing
from oarbank_sdk.manifest import requirements as reqs

__all__ = ["EnvError", "Envs", "digest", "python_of", "DEFAULT_GRACE_S"]

log = logging.getLogger("oarbank_agent")

DEFAULT_GRACE_S = 3600.0
READY = ".ready"
UNUSED = ".unused-since"
BUILD_TIMEOUT_S = 600.0


class EnvError(Exception):
    """The environment could not be built; ``str``: why (the installer's own words)."""


python_of = reqs.env_python


def digest(req: Path, bundle: Path) -> str:
    """Raises ``reqs.RequirementsError`` / ``OSError`` (load has checked the file already)."""
    h = hashlib.sha256()
    h.update(b"oarbank-env 1\0")
    h.update(reqs.host_identity().encode() + b"\0")
    h.update(req.read_bytes() + b"\0")
    pins = reqs.parse(req)
    for name, files in sorted(reqs.wheels_for(pins, bundle / reqs.WHEELS).items()):
        for f in files:
            h.update(f"{name}\0{f.name}\0{reqs.sha256_file(f)}\0".encode())
    return h.hexdigest()[:32]


class Envs:
    def __init__(self, state_dir: Path, registry: procs.ProcessRegistry,
                 grace_s: float = DEFAULT_GRACE_S) -> None:
        self.dir = state_dir / "envs"
        self.registry = registry
        self.grace_s = grace_s
        self._builds: dict[str, asyncio.Task[Path]] = {}
        self.last_build_s: float | None = None  # how long the latest build took (measured)

    async def ensure(self, req: Path, bundle: Path, label: str) -> Path:
        """The environment of ``req`` (built now when missing). Raises ``EnvError``."""
        try:
            key = digest(req, bundle)
        except (OSError, reqs.RequirementsError) as exc:
            raise EnvError(str(exc)) from None
        env = self.dir / key
        if (env / READY).exists():
            (env / UNUSED).unlink(missing_ok=True)
            return env
        task = self._builds.get(key)
        if task is None:
            task = asyncio.ensure_future(self._build(env, req, bundle, label))
            self._builds[key] = task
            task.add_done_callback(lambda _t: self._builds.pop(key, None))
        return await asyncio.shield(task)

    async def _build(self, env: Path, req: Path, bundle: Path, label: str) -> Path:
        started = time.monotonic()
        shutil.rmtree(env, ignore_errors=True)  # a torn build of an earlier agent
        env.mkdir(parents=True)
        log_path = env.parent / f"{env.name}.log"
        try:
            await self._child(reqs.venv_argv(env), env, bundle, log_path, label, "venv")
            try:
                pip = reqs.pip_argv(env, bundle, req)
            except reqs.RequirementsError as exc:
                raise EnvError(str(exc)) from None
            await self._child(pip, env, bundle, log_path, label, "pip install")
            # after pip: the host's site folders are not pip's to read (reqs.PIP_BOOT)
            (reqs.env_purelib(env) / reqs.HOST_PTH).write_text(reqs.host_pth())
        except BaseException:
            shutil.rmtree(env, ignore_errors=True)
            log_path.unlink(missing_ok=True)  # (its reason is in the refusal)
            raise
        shutil.rmtree(env / ".tmp", ignore_errors=True)
        (env / READY).write_text(json.dumps({"requirements": str(req), "built": time.time()}))
        log_path.unlink(missing_ok=True)
        self.last_build_s = time.monotonic() - started
        log.info("environment %s built in %.1f s for %s (%s)", env.name, self.last_build_s,
                 label, req)
        return env

    async def _child(self, argv: list[str], env: Path, bundle: Path, log_path: Path,
                     label: str, what: str) -> None:
        tmp = env / ".tmp"
        tmp.mkdir(exist_ok=True)
        child_env = reqs.install_env(tmp)
        walls = sandboxing.Walls(read=(str(bundle.resolve()),), write=(str(env),))
        with open(log_path, "wb") as log:
            try:
                proc = await procs.spawn(argv, env=child_env, cwd=str(env), stdout=log,
                                         stderr=log, registry=self.registry, kind="op",
                                         label=f"{label} env {what}", walls=walls,
                                         refusal_key=f"{label}/env")
            except OSError as exc:
                raise EnvError(f"{what}: cannot run {argv[0]}: {exc}") from None
            group = procs.group_of(proc)
            try:
                exited, rc = await result_within(proc.wait(), BUILD_TIMEOUT_S)
            finally:  # over (or cancelled): whatever it left goes too
                await procs.retire_group(self.registry, group, 1.0)
            if not exited:
                raise EnvError(f"{what}: no answer within {BUILD_TIMEOUT_S:.0f} s")
        if rc != 0:
            raise EnvError(f"{what} failed (exit {rc}): {_reason(log_path)}")

    def sweep(self, used: set[str], now: float | None = None) -> list[str]:
        """Mark the unused environments; remove those unused for ``grace_s``. Returns the
        removed digests."""
        now = time.time() if now is None else now
        removed = []
        for env in sorted(self.dir.iterdir()) if self.dir.is_dir() else []:
            if not env.is_dir():
                continue
            if env.name in used or env.name in self._builds:
                (env / UNUSED).unlink(missing_ok=True)  # in use again: its grace starts anew
                continue
            mark = env / UNUSED
            try:
                since = float(mark.read_text())
            except (OSError, ValueError):
                mark.write_text(f"{now:.3f}")
                continue
            if now - since >= self.grace_s:
                shutil.rmtree(env, ignore_errors=True)
                removed.append(env.name)
        return removed


def _reason(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no output)"
    errors = [ln.strip() for ln in lines if ln.startswith("ERROR:") or "Error" in ln[:40]]
    picked = errors or [ln.strip() for ln in lines if ln.strip()][-3:]
    return " / ".join(picked)[:1500] or "(no output)"
