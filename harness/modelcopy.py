"""The reference module (examples/modelserver) under another module id, for a node with several
models: the `evict-for-job` scenario and the bench's `--multi-model`. Its own files, copied;
only the manifest's module id and the keys named of its `model` service change."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from oarbank_sdk import manifest as mf

__all__ = ["MODELSERVER", "modelserver_as"]

MODELSERVER = Path(__file__).resolve().parent.parent / "examples" / "modelserver"
_REF_ID = 'id = "dev.example.modelserver"'


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"no TOML form here for {value!r}")


def modelserver_as(dest: Path, module_id: str, **service: object) -> Path:
    """Copy examples/modelserver to ``dest`` (a new folder) as module ``module_id``, each
    ``key=value`` replacing that key's line in its ``[[services]]`` table (e.g.
    ``idle_timeout_s=600``, ``yieldable=False``). ValueError names a key the example's service
    does not set on a line of its own (nothing is added: the copy stays the example)."""
    if dest.exists():
        raise ValueError(f"{dest} exists: the copy goes to a new folder")
    shutil.copytree(MODELSERVER, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    try:
        return _rewrite(dest, module_id, service)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)  # no half-made module left for a later run
        raise


def _rewrite(dest: Path, module_id: str, service: dict[str, object]) -> Path:
    path = dest / "oarbank-module.toml"
    text = path.read_text(encoding="utf-8")
    if text.count(_REF_ID) != 1:
        raise ValueError(f"{MODELSERVER}/oarbank-module.toml: no single line {_REF_ID!r}")
    text = text.replace(_REF_ID, f"id = {json.dumps(module_id)}")
    head, sep, services = text.partition("[[services]]")
    for key, value in service.items():
        line = f"{key} = {_toml(value)}"

        def keep_comment(m: re.Match[str], line: str = line) -> str:
            return line + m.group(1)

        services, n = re.subn(rf"(?m)^{re.escape(key)} = [^#\n]*?(\s*(#.*)?)$",
                              keep_comment, services, count=1)
        if not sep or n != 1:
            raise ValueError(f"the example's [[services]] table sets no {key!r} on a line of "
                             "its own")
    path.write_text(head + sep + services, encoding="utf-8")
    got = mf.load(dest)
    if got.id != module_id:  # the manifest loader checks the id's form too
        raise ValueError(f"the copy at {dest} loads as {got.id!r}, not {module_id!r}")
    return dest
