"""What the conformance kit reads from a module besides its manifest (contract section 8):
the ``settings`` of ``conformance.json`` and the two forms of golden.

- ``settings``: the module's settings for the services the kit starts (written to the file
  ``OARBANK_SETTINGS_FILE`` names, as an agent writes a node's settings for the module).
- Goldens: this project's form ``{"name", "stage", "payload", "expected": {"payload"}}`` runs
  through the runner; upstream's form ``{"name", "key_inputs", "stages", "expected":
  {"digest", "digest_version"}}`` is built into specs by the module's coordinator, which this
  project does not have, so the kit reports it ``skip`` with that reason, never ``FAIL``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..valuekind import kind_of as _kind

__all__ = ["CONFORMANCE_FILE", "settings", "upstream_golden"]

CONFORMANCE_FILE = "conformance.json"

UPSTREAM_GOLDEN_KEYS = ("key_inputs", "stages")


def settings(bundle: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(settings, problem)``: the ``settings`` object of the bundle's conformance.json.

    ``(None, None)`` when there is no file or it names no settings; ``(None, problem)`` when
    the file is unreadable or ``settings`` is not an object (the kit fails that, naming it).
    """
    path = bundle / CONFORMANCE_FILE
    if not path.exists():
        return None, None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return None, f"cannot read {CONFORMANCE_FILE}: {exc}"
    except ValueError as exc:
        return None, f"{CONFORMANCE_FILE} is not JSON: {exc}"
    if not isinstance(doc, dict) or "settings" not in doc:
        return None, None  # the service_specs step says what is wrong with the rest
    value = doc["settings"]
    if not isinstance(value, dict):
        return None, f"{CONFORMANCE_FILE}: 'settings' must be an object, got {_kind(value)}"
    return value, None


def upstream_golden(g: Any) -> str | None:
    """The ``skip`` reason when ``g`` is an upstream-format golden, else None.

    Recognised by what only that form has (``key_inputs`` or ``stages``) and the lack of this
    project's ``stage``; a golden mixing both forms is left to the normal checks, which name
    what is wrong with it.
    """
    if not isinstance(g, dict) or "stage" in g:
        return None
    if not any(k in g for k in UPSTREAM_GOLDEN_KEYS):
        return None
    expected = g.get("expected")
    digest = expected.get("digest_version") if isinstance(expected, dict) else None
    form = f"digest_version {digest}" if digest is not None else "no digest_version"
    return ("upstream-format golden (key_inputs/stages, expected digest; "
            f"{form}): its spec is built by the module's coordinator, which this kit does "
            "not have; give the runner's payload directly as "
            '{"name", "stage", "payload", "expected": {"payload"}} to run it here')

