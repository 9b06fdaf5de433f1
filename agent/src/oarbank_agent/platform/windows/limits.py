"""Memory and CPU limits on Windows, the decisions: a stage's cgroup-style limits
(``memory.max``, ``cpu.max``) as job object values (pure).

``memory.max`` (bytes) is the job's committed-memory limit (``JobMemoryLimit``: an allocation
past it fails; the kernel then posts ``JOB_OBJECT_MSG_JOB_MEMORY_LIMIT``, counted as an
``oom`` kill). ``cpu.max`` (``quota period``: cores) is a hard CPU rate cap, in ten-thousandths
of the whole machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["JobLimits", "job_limits", "WINE_MEMORY_GAP"]

WINE_MEMORY_GAP = "Wine accepts a job object's memory limit but does not enforce it"


@dataclass(frozen=True)
class JobLimits:
    memory_bytes: int = 0  # 0: none
    cpu_rate: int = 0  # 1..10000 of the machine's CPU time; 0: none


def job_limits(files: dict[str, str], cpus: int) -> JobLimits:
    """The job values for ``files`` (``resourcelimits.stage_limits``) on a machine with
    ``cpus`` logical processors. Raises ValueError naming a limit it cannot read."""
    memory = rate = 0
    for name, value in files.items():
        if name == "memory.max":
            memory = _positive_int(name, value)
        elif name == "cpu.max":
            parts = value.split()
            if len(parts) != 2:
                raise ValueError(f"cpu.max {value!r}: want 'quota period'")
            quota, period = (_positive_int(name, p) for p in parts)
            rate = max(1, min(10000, math.ceil(10000 * quota / (period * max(1, cpus)))))
        else:
            raise ValueError(f"limit {name!r} has no job object equivalent "
                             "(memory.max and cpu.max do)")
    return JobLimits(memory, rate)


def _positive_int(name: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{name} {value!r} is not a whole number") from None
    if n <= 0:
        raise ValueError(f"{name} {value!r} must be positive")
    return n
