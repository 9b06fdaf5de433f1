"""Loaded modules and the node's identity: what every op and runner environment is built from.

A module's node-side files live under ``<state>/modules/<module id>/``:
``data/`` (OARBANK_MODULE_DATA; ops get HOME and TMPDIR inside it), ``settings.json`` (this
node's settings for the module: written only when given, never rewritten by a restart) and
``logs/`` (ops' and services' stderr, one file per service).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from oarbank_agent.broker import channel
from oarbank_sdk import environments
from oarbank_sdk import manifest as mf
from oarbank_sdk.manifest import requirements

__all__ = ["NodeInfo", "ModuleCtx", "ModuleRefused", "load_module", "module_names",
           "SettingsError",
           "read_settings_arg", "write_settings", "read_settings_file"]


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    hostname: str
    platform: str
    state_dir: Path
    limits_file: Path
    tools_file: Path

    @classmethod
    def create(cls, state_dir: Path, node_id: str | None) -> NodeInfo:
        hostname = socket.gethostname()
        limits = state_dir / "limits.json"
        tools = state_dir / "tools.json"
        _write_json(limits, {"cpu": os.cpu_count() or 1, "mem_gb": _mem_gb()})
        _write_json(tools, {"python": sys.executable})
        return cls(node_id or hostname, hostname, mf.platform_token(), state_dir, limits, tools)


@dataclass
class ModuleCtx:
    manifest: mf.Manifest
    root: Path  # <state>/modules/<id>
    settings: dict[str, Any] = field(default_factory=dict)
    # requirements.txt (absolute) -> its environment (envs.py): set at load, before any op
    envs: dict[str, Path] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.manifest.id

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def settings_file(self) -> Path:
        return self.root / "settings.json"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    def op_env(self, node: NodeInfo, service: str) -> dict[str, str]:
        """The exact environment of every op (contract section 2); nothing else is inherited.
        An endpoint service's ops also get the features the agent offers (section 3)."""
        svc = self.manifest.service(service)
        features = ({channel.FEATURES_ENV: ",".join(channel.FEATURES)}
                    if svc is not None and svc.endpoint else None)
        return environments.op_env(
            module=self.id, service=service, node_id=node.node_id, platform=node.platform,
            data_dir=self.data_dir, settings_file=self.settings_file,
            limits_file=node.limits_file, tools_file=node.tools_file, extra=features)

    def exec_argv(self, argv: tuple[str, ...] | list[str]) -> list[str]:
        """``python`` is the environment of the ``requirements.txt`` beside the script (the
        host's interpreter without one)."""
        req = requirements.requirements_for(argv, self.manifest.bundle)
        env = self.envs.get(str(req)) if req is not None else None
        python = str(requirements.env_python(env)) if env is not None else sys.executable
        return mf.expand_exec(list(argv), self.manifest.bundle, python)

    @property
    def env_dirs(self) -> tuple[str, ...]:
        """Its environments' folders (its children read them)."""
        return tuple(sorted({str(p) for p in self.envs.values()}))

    def env_report(self) -> dict[str, str]:
        """``{requirements file (bundle-relative): environment digest}`` for status."""
        root = self.manifest.bundle.resolve()
        return {str(Path(k).relative_to(root)) if Path(k).is_relative_to(root) else k: v.name
                for k, v in sorted(self.envs.items())}


class SettingsError(ValueError):
    pass


class ModuleRefused(Exception):
    """A valid manifest this node cannot run (compat.py); ``str`` is the one line said."""

    def __init__(self, module_id: str, line: str) -> None:
        self.module_id = module_id
        super().__init__(line)


def read_settings_arg(arg: str) -> tuple[str, dict[str, Any]]:
    """``MODULE=FILE`` -> (module id or short name, settings object). Raises SettingsError."""
    name, sep, file = arg.partition("=")
    if not sep or not name or not file:
        raise SettingsError(f"--settings {arg!r}: expected MODULE=FILE")
    try:
        value = json.loads(Path(file).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"--settings {arg!r}: cannot read {file}: {exc.strerror}")
    except ValueError as exc:
        raise SettingsError(f"--settings {arg!r}: {file} is not JSON ({exc})")
    if not isinstance(value, dict):
        raise SettingsError(f"--settings {arg!r}: {file} must hold a JSON object")
    return name, value


def load_module(path: Path, state_dir: Path, settings: dict[str, Any] | None,
                refuse: Callable[[mf.Manifest], str | None] | None = None) -> ModuleCtx:
    """Load and check a module; prepare its node-side folders. Raises ``ManifestError``, or
    ``ModuleRefused`` when ``refuse`` names why this node cannot run it (checked before any
    folder is made: a refused module leaves nothing in the state dir).

    ``settings`` given (``--settings`` or the config file): written to ``settings.json``.
    None: the file is left as it is (an operator's edit survives a restart); only a missing
    one is created, as ``{}``."""
    manifest = mf.load(path)
    why = refuse(manifest) if refuse is not None else None
    if why is not None:
        raise ModuleRefused(manifest.id, why)
    ctx = ModuleCtx(manifest, state_dir / "modules" / manifest.id, settings or {})
    for d in (ctx.data_dir, ctx.data_dir / "home", ctx.data_dir / "tmp", ctx.log_dir):
        d.mkdir(parents=True, exist_ok=True)
    if settings is not None:
        write_settings(ctx, settings)
    elif not ctx.settings_file.exists():
        _write_json(ctx.settings_file, {})
    else:
        ctx.settings = read_settings_file(ctx.settings_file)
    return ctx


def write_settings(ctx: ModuleCtx, settings: dict[str, Any]) -> bool:
    """An explicit change: write ``settings.json`` unless it already says this. True if
    written (so a reload with unchanged settings touches nothing)."""
    ctx.settings = settings
    if ctx.settings_file.exists() and read_settings_file(ctx.settings_file) == settings:
        return False
    _write_json(ctx.settings_file, settings)
    return True


def read_settings_file(path: Path) -> dict[str, Any]:
    """What ``settings.json`` holds now ({} when it is unreadable or not an object: the ops
    read it themselves and say what is wrong)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def module_names(path: Path) -> set[str]:
    """The names a person may give ``submit`` for the module at ``path`` even when its manifest
    is refused: its folder, and its ``[module] id`` and short name when they can be read."""
    folder = path if path.is_dir() else path.parent
    names = {folder.name}
    toml = folder / "oarbank-module.toml" if path.is_dir() else path
    try:
        with open(toml, "rb") as f:
            module_id = tomllib.load(f).get("module", {}).get("id")
    except (OSError, ValueError, AttributeError):
        module_id = None
    if isinstance(module_id, str) and module_id:
        names |= {module_id, module_id.rsplit(".", 1)[-1]}
    return names


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _mem_gb() -> float:
    try:
        from oarbank_agent.host import memory

        return round(memory.total_bytes() / 2**30, 2)
    except Exception:  # pragma: no cover - psutil is a dependency; be robust anyway
        return 0.0
