"""Reading a service's ``fingerprint`` answer (contract section 2), pure.

A fingerprint that is not usable never crashes the agent and never offers pools: the service
reads as ``unhealthy`` with a problem a person can act on. Rules:

- ``service_protocol.supported`` must list 1 (the only protocol this agent speaks);
- ``health`` is ``healthy`` / ``unhealthy`` / ``undetected``; anything else is unhealthy;
- ``pools`` counts are non-negative integers; only a healthy service offers them;
- ``reserve.mem_gb`` is a non-negative number (0 when absent);
- ``running`` is true only when it says exactly ``true``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oarbank_sdk import advice

__all__ = ["SERVICE_PROTOCOL", "Fingerprint", "parse"]

SERVICE_PROTOCOL = advice.SERVICE_PROTOCOL
_HEALTH = ("healthy", "unhealthy", "undetected")


@dataclass(frozen=True)
class Fingerprint:
    health: str
    pools: dict[str, int] = field(default_factory=dict)
    running: bool = False
    reserve_gb: float = 0.0
    problem: str | None = None  # why it offers nothing although the op succeeded


def _is_count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def parse(doc: dict[str, Any]) -> Fingerprint:
    running = doc.get("running") is True
    reserve = doc.get("reserve")
    gb = reserve.get("mem_gb") if isinstance(reserve, dict) else None
    reserve_gb = float(gb) if isinstance(gb, (int, float)) and not isinstance(gb, bool) and gb >= 0 else 0.0
    wrong_protocol = advice.protocol_problem(doc.get("service_protocol"))  # conform's words
    if wrong_protocol:
        return Fingerprint("unhealthy", {}, running, reserve_gb, wrong_protocol)
    health = doc.get("health")
    if health not in _HEALTH:
        return Fingerprint("unhealthy", {}, running, reserve_gb,
                           f"fingerprint: health {health!r} is not one of {', '.join(_HEALTH)}")
    raw = doc.get("pools")
    pools = {p: n for p, n in raw.items() if _is_count(n)} if isinstance(raw, dict) else {}
    if health != "healthy":
        pools = {}  # an unhealthy service offers nothing
    return Fingerprint(health, pools, running, reserve_gb)
