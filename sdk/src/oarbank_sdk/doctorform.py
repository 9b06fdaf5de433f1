"""A runner's ``doctor --json`` answer (contract section 4), as data: what its form must be.

    {"runner_protocol": {"supported": [1]}, "health": "healthy" | "unhealthy" | "undetected",
     "capabilities": [...], "attrs"?: {...}, "checks"?: [{"name", "ok", "detail"?}]}

The agent reads the health from it (``oarbank_agent.jobs.runnerhealth``, lenient: whatever it can
act on); the conformance kit holds a module's doctor to the whole form (``form_problems``,
strict). An older ``{"ok": bool}`` answer is still taken by the agent, and the kit warns
that it is not the contract's form. Standard library only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HEALTHS", "TIMEOUT_S", "failed_checks", "form_problems", "is_older_form",
           "supported"]

HEALTHS = ("healthy", "unhealthy", "undetected")
TIMEOUT_S = 60.0  # the doctor must finish within this (contract section 4)


def supported(doc: dict[str, Any]) -> Any:
    """``runner_protocol.supported`` as the doctor wrote it (None where there is none)."""
    proto = doc.get("runner_protocol")
    return proto.get("supported") if isinstance(proto, dict) else None


def failed_checks(doc: dict[str, Any]) -> list[str]:
    """``name: detail`` (or ``name``) of each check the doctor says did not pass."""
    checks = doc.get("checks")
    if not isinstance(checks, list):
        return []
    return [f"{c.get('name', '?')}: {c['detail']}" if c.get("detail") else str(c.get("name", "?"))
            for c in checks if isinstance(c, dict) and c.get("ok") is not True]


def form_problems(doc: Any) -> list[str]:
    """What keeps ``doc`` from being the contract's answer (empty: it is)."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    problems = []
    versions = supported(doc)
    if not (isinstance(versions, list) and versions
            and all(isinstance(v, int) and not isinstance(v, bool) for v in versions)):
        problems.append('runner_protocol: must be {"supported": [<protocol integers>]}, '
                        f"got {doc.get('runner_protocol')!r}")
    if doc.get("health") not in HEALTHS:
        problems.append(f"health: must be one of {', '.join(HEALTHS)}, got {doc.get('health')!r}")
    caps = doc.get("capabilities")
    if not (isinstance(caps, list) and all(isinstance(c, str) for c in caps)):
        problems.append(f"capabilities: must be a list of strings, got {caps!r}")
    if "attrs" in doc and not isinstance(doc["attrs"], dict):
        problems.append(f"attrs: must be an object, got {doc['attrs']!r}")
    checks = doc.get("checks", [])
    if not isinstance(checks, list):
        problems.append(f"checks: must be a list, got {checks!r}")
        checks = []
    for i, c in enumerate(checks):
        if not (isinstance(c, dict) and isinstance(c.get("name"), str)
                and isinstance(c.get("ok"), bool)
                and isinstance(c.get("detail", ""), str)):
            problems.append(f'checks[{i}]: must be {{"name": str, "ok": bool, "detail"?: str}}, '
                            f"got {c!r}")
    return problems


def is_older_form(doc: Any) -> bool:
    """The ``{"ok": bool}`` answer runners gave before the contract's form."""
    return isinstance(doc, dict) and "ok" in doc and "health" not in doc
