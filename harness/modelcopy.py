"""A module under another module id, its own files copied: the reference module
(examples/modelserver), for a node with several models (the `evict-for-job` scenario, the
bench's `--multi-model` and `--fleet`), where only the manifest's module id and the keys named
of its `model` service change; and the chaos run's ledger module (harness/e2e/modules/ledger),
for the `fleet-dispatch` scenario and the bench's fleet faults."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from oarbank_sdk import manifest as mf

__all__ = ["LEDGER", "MODELSERVER", "ledger_as", "modelserver_as"]

MODELSERVER = Path(__file__).resolve().parent.parent / "examples" / "modelserver"
_REF_ID = 'id = "dev.example.modelserver"'
LEDGER = Path(__file__).resolve().parent / "e2e" / "modules" / "ledger"
_LEDGER_ID = 'id = "dev.oarbank.e2e.ledger"'


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


def ledger_as(dest: Path, module_id: str) -> Path:
    """Copy harness/e2e/modules/ledger to ``dest`` (a new folder) as module ``module_id``,
    whole: completed with the files of the folder its harness-base.txt names, as a node's copy
    is (harness/nodes/backends/base.py), so that an agent on this machine runs it too."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "harness-base.txt")
    base = MODELSERVER.parent.parent / (LEDGER / "harness-base.txt").read_text().strip()
    shutil.copytree(base, dest, ignore=ignore)
    shutil.copytree(LEDGER, dest, ignore=ignore, dirs_exist_ok=True)
    toml = dest / "oarbank-module.toml"
    text = toml.read_text(encoding="utf-8")
    if text.count(_LEDGER_ID) != 1:
        raise ValueError(f"{LEDGER}/oarbank-module.toml: no single line {_LEDGER_ID!r}")
    toml.write_text(text.replace(_LEDGER_ID, f"id = {json.dumps(module_id)}"), encoding="utf-8")
    return dest
