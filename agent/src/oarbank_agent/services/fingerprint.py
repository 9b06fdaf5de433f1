"""Reading a service's ``fingerprint`` answer (contract section 2), pure.

A fingerprint that is not usable never crashes the agent and never offers pools: the service
reads as ``unhealthy`` with a problem a person can act on. Rules:

- ``service_protocol.supported`` must list 1 (the only protocol this agent speaks);
- ``health`` is ``healthy`` / ``unhealthy`` / ``undetected``; anything else is unhealthy;
- ``pools`` counts are non-negative integers; only a healthy service offers them;
- ``reserve`` names only ``mem_gb`` (host memory) and ``gpu_mem_gb`` (GPU memory), each a
  non-negative number (0 when absent); any other key, or a negative or non-number amount,
  is a problem naming the key (the service offers nothing: what it costs is unknown; at
  load, its module is refused: ``reserve_problem``);
- ``running`` is true only when it says exactly ``true``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oarbank_sdk import advice

__all__ = ["SERVICE_PROTOCOL", "RESERVE_UNITS", "Fingerprint", "parse", "reserve_of"]

SERVICE_PROTOCOL = advice.SERVICE_PROTOCOL
_HEALTH = ("healthy", "unhealthy", "undetected")


@dataclass(frozen=True)
class Fingerprint:
    health: str
    pools: dict[str, int] = field(default_factory=dict)
    running: bool = False
    reserve_gb: float = 0.0
    problem: str | None = None  # why it offers nothing although the op succeeded
    reserve_gpu_gb: float = 0.0  # reserve.gpu_mem_gb: GPU memory it holds while it runs
    reserve_problem: str | None = None  # a reserve it cannot account, whatever else is wrong


RESERVE_UNITS = ("mem_gb", "gpu_mem_gb")


def reserve_of(reserve: Any) -> tuple[dict[str, float], str | None]:
    """The fingerprint's ``reserve`` -> ({unit: amount}, None), or ({}, the problem naming
    the key)."""
    if reserve is None:
        return {}, None
    if not isinstance(reserve, dict):
        return {}, f"fingerprint: reserve must be an object, got {type(reserve).__name__}"
    out: dict[str, float] = {}
    for key, v in reserve.items():
        if key not in RESERVE_UNITS:
            return {}, (f"fingerprint: reserve.{key}: unknown unit (this agent knows "
                        f"{', '.join(RESERVE_UNITS)})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            return {}, f"fingerprint: reserve.{key}: must be a number >= 0 (GB), got {v!r}"
        out[key] = float(v)
    return out, None


def _is_count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def parse(doc: dict[str, Any]) -> Fingerprint:
    running = doc.get("running") is True
    reserve, bad_reserve = reserve_of(doc.get("reserve"))
    reserve_gb, gpu_gb = reserve.get("mem_gb", 0.0), reserve.get("gpu_mem_gb", 0.0)
    wrong_protocol = advice.protocol_problem(doc.get("service_protocol"))  # conform's words
    if wrong_protocol:
        return Fingerprint("unhealthy", {}, running, reserve_gb, wrong_protocol, gpu_gb,
                           reserve_problem=bad_reserve)
    if bad_reserve:
        return Fingerprint("unhealthy", {}, running, 0.0, bad_reserve,
                           reserve_problem=bad_reserve)
    health = doc.get("health")
    if health not in _HEALTH:
        return Fingerprint("unhealthy", {}, running, reserve_gb,
                           f"fingerprint: health {health!r} is not one of {', '.join(_HEALTH)}",
                           gpu_gb)
    raw = doc.get("pools")
    pools = {p: n for p, n in raw.items() if _is_count(n)} if isinstance(raw, dict) else {}
    if health != "healthy":
        pools = {}  # an unhealthy service offers nothing
    return Fingerprint(health, pools, running, reserve_gb, reserve_gpu_gb=gpu_gb)
