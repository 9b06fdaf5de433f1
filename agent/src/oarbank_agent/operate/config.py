"""``--config FILE``: the node's ``run`` options in one TOML file a config management tool owns.

Every ``run`` flag is a key, spelled as the flag without its dashes, ``-`` as ``_``
(``--state-dir`` -> ``state_dir``, ``--module`` -> ``module``, a list); two keys are tables:

```toml
state_dir = "/var/lib/oarbank-agent"
module = ["/opt/oarbank/modules/modelserver"]
node_id = "gpu-17"
log_file = "/var/log/oarbank-agent/agent.log"

[settings.modelserver]        # this node's settings for a module (id or short name)
slots = 2                     # (or: modelserver = "/etc/oarbank/modelserver.json")

[services."example.modelserver/model"]   # timing overrides, see overrides.py
idle_timeout_s = 120
```

``/etc/oarbank/agent.toml`` is read when ``--config`` is not given and it exists. Flags
override the file: a flag given on the command line wins over its key (a list flag such as
``--module`` replaces the file's list; ``--settings`` replaces the file's entry for that module
only). Relative paths in the file are relative to the file's folder (an agent under systemd
runs in ``/``). Anything wrong is a ``ConfigError`` naming the file and the key.

The file's values go through the very parser the flags do (each key becomes the flag's tokens),
so a value the flag refuses is refused in the file with the same words.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oarbank_agent.operate.options import Recorder

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["DEFAULT_PATH", "ConfigError", "RunArgs", "load_run_args", "TABLE_KEYS"]

DEFAULT_PATH = Path("/etc/oarbank/agent.toml")
TABLE_KEYS = ("settings", "services")
# Options that only make sense on a command line, never in the file.
_NOT_IN_FILE = ("config",)
# Keys whose values are paths: relative ones are taken from the config file's folder.
_PATH_DESTS = ("state_dir", "modules", "log_file", "portal_token_file", "portal_ca",
               "metrics_textfile")


class ConfigError(ValueError):
    pass


@dataclass
class RunArgs:
    """``run``'s options after the file and the flags are merged."""

    args: argparse.Namespace  # every run option (the parser's defaults where nobody said)
    config_path: Path | None  # the file read, if any
    # module id or short name -> settings object: from the file and from --settings files.
    # A module absent here gets no write of its settings.json (never rewritten on a restart).
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    # "<module id>/<service>" -> {timing key: value} (checked against the manifest later).
    services: dict[str, dict[str, Any]] = field(default_factory=dict)


class _Refusing(argparse.ArgumentParser):
    """A parser that raises instead of printing usage and exiting (the file's values)."""

    def error(self, message: str) -> Any:
        raise ConfigError(message)


def _suppressing(make: Callable[[type[argparse.ArgumentParser]], Recorder],
                 cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The run parser with no defaults: its namespace holds only what was given."""
    made = make(cls)
    for a in made.actions:
        if a.dest != "help":
            a.default = argparse.SUPPRESS
            a.required = False
    parser: argparse.ArgumentParser = made.parser
    return parser


def _key(action: argparse.Action) -> str | None:
    longs = [o for o in action.option_strings if o.startswith("--")]
    return longs[0][2:].replace("-", "_") if longs else None


def _tokens(action: argparse.Action, kind: str | None, key: str, value: Any,
            base: Path) -> list[str]:
    """The command-line tokens a file value stands for (so the flag's own checks apply)."""
    flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else \
        action.option_strings[0]
    if kind == "store_true":
        if not isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r}: expected true or false")
        return [flag] if value else []
    values = value if kind == "append" else [value]
    if kind == "append" and not isinstance(value, list):
        raise ConfigError(f"{key} = {value!r}: expected a list")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ConfigError(f"{key} = {v!r}: expected a string or a number")
        text = str(v)
        if action.dest in _PATH_DESTS and not Path(text).expanduser().is_absolute():
            text = str(base / text)
        out += [flag, text]
    return out


def _read_settings_value(name: str, value: Any, base: Path) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        path = Path(value) if Path(value).is_absolute() else base / value
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"settings.{name}: cannot read {path}: {exc.strerror}") from None
        except ValueError as exc:
            raise ConfigError(f"settings.{name}: {path} is not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"settings.{name}: {path} must hold a JSON object")
        return doc
    raise ConfigError(f"settings.{name}: expected a table of settings or the path of a JSON "
                      f"file, got {type(value).__name__}")


def read_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read it: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}") from None


def load_run_args(argv: list[str],
                  make_options: Callable[[type[argparse.ArgumentParser]], Recorder],
                  read_settings_arg: Callable[[str], tuple[str, dict[str, Any]]],
                  default_path: Path = DEFAULT_PATH) -> RunArgs:
    """Merge ``run``'s flags (``argv``: after ``run``) over the config file. Raises
    ``ConfigError`` (file problems) or ``SystemExit`` (flag problems, argparse's usage)."""
    full = make_options(argparse.ArgumentParser)
    defaults = full.parser.parse_args([])  # nothing required at this level: checked after the merge
    given = _suppressing(make_options, argparse.ArgumentParser).parse_args(argv)
    config_path: Path | None = getattr(given, "config", None)
    if config_path is None and default_path.exists():
        config_path = default_path
    from_file = argparse.Namespace()
    file_settings: dict[str, dict[str, Any]] = {}
    services: dict[str, dict[str, Any]] = {}
    if config_path is not None:
        where = str(config_path)
        base = config_path.resolve().parent
        by_key = {k: a for a in full.actions if (k := _key(a)) and k not in _NOT_IN_FILE}
        by_key["module"] = next(a for a in full.actions if a.dest == "modules")
        tokens: list[str] = []
        try:
            doc = read_file(config_path)
            for key, value in doc.items():
                if key == "settings":
                    if not isinstance(value, dict):
                        raise ConfigError("settings: expected a table (module -> settings)")
                    file_settings = {n: _read_settings_value(n, v, base)
                                     for n, v in value.items()}
                    continue
                if key == "services":
                    if not isinstance(value, dict) or not all(isinstance(v, dict)
                                                              for v in value.values()):
                        raise ConfigError('services: expected tables, e.g. [services."my.module/'
                                          'model"] idle_timeout_s = 120')
                    services = {k: dict(v) for k, v in value.items()}
                    continue
                action = by_key.get(key)
                if action is None:
                    near = difflib.get_close_matches(key, [*by_key, *TABLE_KEYS], n=1)
                    hint = f"; did you mean {near[0]!r}?" if near else ""
                    raise ConfigError(f"{key}: not a run option{hint} (keys are the flags of "
                                      "`oarbank-agent run --help` without their dashes, - as _)")
                tokens += _tokens(action, full.kind(action), key, value, base)
            from_file = _suppressing(make_options, _Refusing).parse_args(tokens)
        except ConfigError as exc:
            raise ConfigError(f"--config {where}: {exc}") from None
    merged = vars(defaults) | vars(from_file) | vars(given)
    args = argparse.Namespace(**merged)
    settings = dict(file_settings)
    for arg in getattr(given, "settings", []):
        name, value = read_settings_arg(arg)  # SettingsError names the flag
        settings[name] = value
    if args.state_dir is None:
        raise ConfigError("--state-dir is required (on the command line, or state_dir in "
                          f"the config file{' ' + str(config_path) if config_path else ''})")
    if not args.modules and not args.allow_empty:
        raise ConfigError("--module is required (on the command line, or module = [...] in "
                          "the config file), unless --allow-empty")
    return RunArgs(args, config_path, settings, services)
