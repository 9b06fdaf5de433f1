"""Host protection decisions (contract section 5): pure functions, no processes, no clock.

Rules:

- Memory pressure is read from the fraction of the host's memory that is available.
  Below the **hard floor**: HARD. Below the **soft floor**: SOFT. Pressure ends only once the
  available fraction is back above ``soft + recover_margin`` (hysteresis: a service that was
  just stopped and gave its memory back must not flap straight back up).
- SOFT: every idle (no users), running, ``yieldable`` service is stopped and held
  (``preempt_memory``) until pressure ends. Non-yieldable services are never touched.
- HARD: additionally, one victim per sample among running jobs and running yieldable
  services, the largest footprint first; a service victim takes its users' jobs with it
  (they are *released*: requeued without charge).
- GPU protection: while GPU work is forbidden, yieldable GPU services are stopped and held
  (``preempt_protection``) and GPU jobs are not admitted; an eviction stops every yieldable
  service the same way.
- GPU placement: a service with ``apis_any`` exists on a node only if the host provides one
  of them; otherwise it is ``gpu_api_missing`` and jobs needing it are refused at submit.

The agent samples the OS (psutil) and acts; this module only decides.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The hold rule is the lifecycle's (every input of a service decision lives there); it is
# named here too because host protection is where a newcomer looks for it.
from oarbank_agent.services.lifecycle import hold_override

__all__ = [
    "Floors",
    "Pressure",
    "Candidate",
    "classify",
    "soft_stops",
    "hard_victim",
    "gpu_api_missing",
    "memory_fits",
    "parse_fraction",
    "hold_override",
    "HELD_MEMORY",
    "HELD_PROTECTION",
]

HELD_MEMORY = "preempt_memory"
HELD_PROTECTION = "preempt_protection"


@dataclass(frozen=True)
class Floors:
    """Fractions of total memory (0..1) that must stay available."""

    soft: float = 0.12
    hard: float = 0.08
    recover_margin: float = 0.03

    def __post_init__(self) -> None:
        if not 0.0 <= self.hard <= self.soft < 1.0:
            raise ValueError(
                f"memory floors must satisfy 0 <= hard <= soft < 1 (hard {self.hard}, soft {self.soft})"
            )
        if self.recover_margin < 0:
            raise ValueError("recover_margin must not be negative")


class Pressure(enum.Enum):
    NONE = "none"
    SOFT = "soft"
    HARD = "hard"


def classify(available_fraction: float, floors: Floors, previous: Pressure) -> Pressure:
    """The pressure now, given the last one (hysteresis on the way down)."""
    if available_fraction < floors.hard:
        return Pressure.HARD
    if available_fraction < floors.soft:
        return Pressure.SOFT
    if previous is not Pressure.NONE and available_fraction < floors.soft + floors.recover_margin:
        # Recovering but not yet clear of the soft floor by the margin: stay held.
        return Pressure.SOFT
    return Pressure.NONE


@dataclass(frozen=True)
class Candidate:
    """Something host protection may stop: a running job or a running service."""

    key: str  # job id, or "<module id>/<service>"
    kind: str  # "job" or "service"
    footprint_bytes: int  # resident memory of its process group
    yieldable: bool = True  # services: the manifest's `yieldable`; jobs: always True
    users: int = 0  # services: jobs using it now


def soft_stops(services: Iterable[Candidate]) -> list[str]:
    """Services to stop under the soft floor: running, idle, yieldable. In a stable order."""
    return sorted(c.key for c in services if c.kind == "service" and c.yieldable and c.users == 0)


def hard_victim(candidates: Sequence[Candidate]) -> Candidate | None:
    """The one victim under the hard floor: largest footprint among jobs and yieldable services.

    Ties go to a service (stopping it releases memory for everyone's benefit and its jobs are
    requeued, not failed), then to the key for determinism.
    """
    eligible = [c for c in candidates if c.kind == "job" or c.yieldable]
    if not eligible:
        return None
    return max(eligible, key=lambda c: (c.footprint_bytes, c.kind == "service", c.key))


def gpu_api_missing(apis_any: Sequence[str], host_apis: Iterable[str]) -> str | None:
    """None when the host provides one of ``apis_any``; else the contract's explanation."""
    have = sorted(set(host_apis))
    if not apis_any or set(apis_any) & set(have):
        return None
    return f"GPU_API_MISSING: needs {', '.join(apis_any)}; this node provides {', '.join(have) or 'none'}"


def memory_fits(charged_gb: float, request_gb: float, budget_gb: float) -> bool:
    """Whether a job or service costing ``request_gb`` fits next to what is already charged."""
    return charged_gb + request_gb <= budget_gb + 1e-9


def parse_fraction(text: str, what: str) -> float:
    """``"12%"``, ``"12"`` (a percentage when above 1) or ``"0.12"`` -> 0.12. Raises
    ValueError naming ``what``."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a fraction (0.12) or a percentage (12%)") \
            from None
    if not raw.endswith("%") and value > 1:
        value /= 100
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{what}: {text!r} must be between 0 and 100%")
    return value
