"""Host protection decisions: pressure with hysteresis, who yields, GPU placement text."""

from __future__ import annotations

import pytest

from oarbank_agent.protection.decisions import (
    Candidate,
    Floors,
    Pressure,
    classify,
    gpu_api_missing,
    hard_victim,
    memory_fits,
    soft_stops,
)

FLOORS = Floors(soft=0.12, hard=0.08, recover_margin=0.03)


@pytest.mark.parametrize(
    ("available", "previous", "expected"),
    [
        (0.50, Pressure.NONE, Pressure.NONE),
        (0.11, Pressure.NONE, Pressure.SOFT),
        (0.07, Pressure.NONE, Pressure.HARD),
        (0.07, Pressure.SOFT, Pressure.HARD),
        # recovering: above the soft floor but inside the margin stays held
        (0.13, Pressure.SOFT, Pressure.SOFT),
        (0.13, Pressure.HARD, Pressure.SOFT),
        (0.13, Pressure.NONE, Pressure.NONE),
        (0.16, Pressure.SOFT, Pressure.NONE),
    ],
)
def test_pressure_has_hysteresis(available: float, previous: Pressure, expected: Pressure) -> None:
    assert classify(available, FLOORS, previous) is expected


def test_floors_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="hard <= soft"):
        Floors(soft=0.05, hard=0.10)


def test_soft_floor_stops_only_idle_yieldable_services() -> None:
    services = [
        Candidate("m/idle", "service", 100, yieldable=True, users=0),
        Candidate("m/busy", "service", 100, yieldable=True, users=2),
        Candidate("m/pinned", "service", 100, yieldable=False, users=0),
    ]
    assert soft_stops(services) == ["m/idle"]


def test_hard_victim_is_largest_footprint_never_a_pinned_service() -> None:
    cands = [
        Candidate("job-1", "job", 300),
        Candidate("m/model", "service", 900, yieldable=True, users=3),
        Candidate("m/pinned", "service", 5000, yieldable=False),
    ]
    assert hard_victim(cands) == cands[1]
    assert hard_victim([Candidate("m/pinned", "service", 5000, yieldable=False)]) is None
    assert hard_victim([Candidate("job-2", "job", 10), Candidate("job-3", "job", 20)]).key == "job-3"


def test_gpu_api_missing_text_is_the_contracts() -> None:
    assert gpu_api_missing(["cuda", "metal"], []) == (
        "GPU_API_MISSING: needs cuda, metal; this node provides none"
    )
    assert gpu_api_missing(["cuda"], ["vulkan", "opencl"]) == (
        "GPU_API_MISSING: needs cuda; this node provides opencl, vulkan"
    )
    assert gpu_api_missing(["cuda", "vulkan"], ["vulkan"]) is None
    assert gpu_api_missing([], []) is None


def test_memory_budget() -> None:
    assert memory_fits(3.0, 1.0, 4.0)
    assert not memory_fits(3.5, 1.0, 4.0)
