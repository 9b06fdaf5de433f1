"""The guard samples and reports actions; it changes nothing outside itself (the agent applies
them). A real supervisor with no services, the real memory sample, floors chosen so the
pressure is certain."""

from __future__ import annotations

from pathlib import Path

import pytest

from oarbank_agent.broker.channel import Channels
from oarbank_agent.modules.loaded import NodeInfo
from oarbank_agent.procs import ProcessRegistry
from oarbank_agent.protection.decisions import Floors
from oarbank_agent.protection.guard import (
    Admit,
    AllowGpu,
    Guard,
    GuardConfig,
    HoldRunners,
    Pause,
    ReleaseGpuJobs,
)
from oarbank_agent.services.supervisor import Supervisor


def guard(tmp_path: Path, floors: Floors, reported: list) -> Guard:
    sup = Supervisor(NodeInfo.create(tmp_path, "n1"), ProcessRegistry(tmp_path),
                     channels=Channels())
    return Guard(GuardConfig(floors), sup, running_jobs=dict, report=reported.append)


def test_host_rules_are_reported_as_actions(tmp_path: Path) -> None:
    g = guard(tmp_path, Floors(), [])
    assert g.set_rule("forbid-gpu") == [AllowGpu(False), ReleaseGpuJobs("preempt_protection")]
    assert g.set_rule("allow-gpu") == [AllowGpu(True)]
    assert g.set_rule("evict") == [AllowGpu(True)]  # no service to hold here
    assert g.rules() == {"gpu_forbidden": False, "evicted": True}
    with pytest.raises(ValueError):
        g.set_rule("reboot")


def test_pressure_pauses_admission_and_its_end_admits_again(tmp_path: Path) -> None:
    g = guard(tmp_path, Floors(soft=0.999, hard=0.998), [])
    out = g.sample()  # no machine keeps 99.8% of its memory free: hard pressure
    assert len(out) == 2 and isinstance(out[0], Pause) and out[0].reason is not None
    assert out[0].reason.startswith("memory pressure: ")
    assert out[1] == HoldRunners(out[0].reason)  # runners that accept a pause are held
    assert g.report(4.0, 1.23456)["pressure"] == "hard"
    assert (g.report(4.0, 1.23456)["budget_gb"], g.report(4.0, 1.23456)["charged_gb"]) == \
        (4.0, 1.235)
    g.config = GuardConfig(Floors(soft=0.0, hard=0.0, recover_margin=0.0))
    assert g.sample() == [Pause(None), HoldRunners(None), Admit()]
    assert g.sample() == [Pause(None), HoldRunners(None)]  # no change: nothing to admit again
