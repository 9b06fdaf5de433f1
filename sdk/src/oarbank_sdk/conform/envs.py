"""The kit's module environments, as the agent installs them (contract section 4): each
``requirements.txt`` the module's ``exec`` uses, installed offline from the bundle's wheels into
a folder of the kit's node (``<node>/envs/<n>``), each step inside the sandbox (``wrap``: reads
the bundle, writes only the new environment); ``python`` in that ``exec`` is its interpreter.
The steps are ``manifest/requirements.py``'s, the agent's own."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .. import manifest as _manifest
from ..manifest import requirements as reqs
from .report import FAIL, OK, Report

Wrap = Callable[..., list[str]]
NAME = "environment"
TIMEOUT_S = 600.0


def install(m: _manifest.Manifest, root: Path, wrap: Wrap, report: Report) -> dict[str, Path]:
    """requirements file (absolute) -> its environment, one line in the report each; one that
    failed is left out (its scripts then fail on their imports, and say so)."""
    execs = ([m.runner.exec] if m.runner is not None else []) + [s.exec for s in m.services]
    found: dict[str, Path] = {}
    for argv in execs:
        req = reqs.requirements_for(argv, m.bundle)
        if req is None or str(req) in found:
            continue
        rel = req.relative_to(m.bundle.resolve()) if req.is_relative_to(m.bundle.resolve()) else req
        env = root / "envs" / str(len(found))
        t0 = time.monotonic()
        why = _build(env, m.bundle.resolve(), req, wrap)
        if why is None:
            found[str(req)] = env
            report.add(OK, f"{NAME} {rel}", f"installed offline in {time.monotonic() - t0:.1f} s")
        else:
            report.add(FAIL, f"{NAME} {rel}", why)
    return found


def _build(env: Path, bundle: Path, req: Path, wrap: Wrap) -> str | None:
    env.mkdir(parents=True)
    tmp = env / ".tmp"
    tmp.mkdir()
    walls = {"read": [bundle], "write": [env]}
    try:
        steps = (("venv", reqs.venv_argv(env)), ("pip install", reqs.pip_argv(env, bundle, req)))
    except reqs.RequirementsError as exc:
        return str(exc)
    for what, argv in steps:
        try:
            done = subprocess.run(wrap(argv, **walls), cwd=str(env), env=reqs.install_env(tmp),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{what}: {exc}"
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).splitlines()
            errors = [ln.strip() for ln in lines if ln.startswith("ERROR:")] or lines[-3:]
            return f"{what} failed (exit {done.returncode}): " + " / ".join(errors)[:1500]
    # after pip: the host's site folders are not pip's to read (reqs.PIP_BOOT)
    (reqs.env_purelib(env) / reqs.HOST_PTH).write_text(reqs.host_pth())
    return None


def python_for(envs: dict[str, Path], argv: tuple[str, ...] | list[str],
               bundle: Path) -> str | None:
    """The interpreter ``python`` is for ``argv`` (None: the host's)."""
    req = reqs.requirements_for(argv, bundle)
    env = envs.get(str(req)) if req is not None else None
    return str(reqs.env_python(env)) if env is not None else None
