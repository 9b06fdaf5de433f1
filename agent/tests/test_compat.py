"""A module that cannot run on this node is refused with the reason (compat.py; contract 1.2):
platforms, core/agent ranges, protocol lists, [sandbox] needs the sandbox cannot meet. Pure
matches first, then real agents: the line at load, `status`, and the submit answer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import write_module

from oarbank_agent.modules import compat
from oarbank_agent.operate import control
from oarbank_sdk import manifest as mf
from oarbank_sdk.versions import allows

HERE = mf.platform_token()
OTHER = "windows-arm64" if HERE != "windows-arm64" else "linux-amd64"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_agent", *args], capture_output=True,
                          text=True, timeout=120)


def _refusals(tmp_path: Path, **kw) -> list[str]:
    return compat.module_refusals(mf.load(write_module(tmp_path / "m", **kw)),
                                  compat.Node(HERE))


@pytest.mark.parametrize("rng,version,ok", [
    (">=2.5,<3", "2.5", True), (">=2.5,<3", "2.9.1", True), (">=2.5,<3", "3.0", False),
    (">=2.6", "2.5", False), ("==2.*", "2.5", True), ("==3.*", "2.5", False),
    ("~=2.5", "2.9", True), ("~=2.5", "3", False), ("!=2.5", "2.5", False), ("<2.5", "2.5", False),
])
def test_version_ranges_allow_what_they_say(rng, version, ok):
    assert allows(rng, version) is ok


def test_a_module_for_this_node_has_no_refusal(tmp_path):
    assert _refusals(tmp_path, requires={"platforms": [HERE, OTHER]},
                     extra='\n[sandbox]\nnet = "none"\n') == []
    # upstream's table form of the same
    assert _refusals(tmp_path, requires={"platforms": [HERE]},
                     extra='\n[sandbox]\nnet = { mode = "none" }\n') == []
    assert _refusals(tmp_path, requires={"platforms": [HERE]},
                     extra='\n[sandbox]\nnet = { mode = "egress-allowlist", allow = ["x.example"] }\n'
                     )[0].startswith("[sandbox].net = ")


def test_each_unmet_need_is_named(tmp_path):
    why = _refusals(tmp_path, requires={"platforms": [OTHER], "core": ">=3", "agent": ">=99",
                                        "runner_protocol": [2], "service_protocol": [2]},
                    extra='\n[sandbox]\nnet = "host"\nfolders = ["/srv/models"]\n')
    assert why == [
        f"requires.platforms [{OTHER}] does not include this node's {HERE}",
        f'requires.core ">=3" does not allow this agent\'s core version {compat.CORE_VERSION}',
        f'requires.agent ">=99" does not allow this agent\'s agent version '
        f"{compat.AGENT_VERSION}",
        "requires.runner_protocol [2] does not list 1, the only runner protocol this agent "
        "speaks",
        "requires.service_protocol [2] does not list 1, the only service protocol this agent "
        "speaks",
        '[sandbox].net = "host": this agent\'s sandbox gives every child no network (only '
        'net = "none" can be met)',
        "[sandbox].folders = ['/srv/models']: this agent's sandbox grants no folders (a child "
        "reaches only its own workdir or data dir)",
    ]


def test_an_always_service_for_another_platform_refuses_the_module(tmp_path):
    why = _refusals(tmp_path, service={"lifecycle": "always", "endpoint": False,
                                       "platforms": [OTHER]},
                    stages=[{"name": "plain", "timeout_s": 60}])
    assert why == [f"services.echo (lifecycle always) runs on [{OTHER}], not on this node's "
                   f"{HERE}"]


def test_stages_for_another_platform_are_refused_each_with_why(tmp_path):
    m = mf.load(write_module(tmp_path / "m", service={"platforms": [OTHER]}, stages=[
        {"name": "echo", "timeout_s": 60, "requires": {"pools": {"echo": 1}}},
        {"name": "elsewhere", "timeout_s": 60, "requires": {"platforms": [OTHER]}},
        {"name": "plain", "timeout_s": 60}]))
    assert compat.module_refusals(m, compat.Node(HERE)) == []  # on_demand: never started
    assert compat.stage_refusal(m, m.stage("echo"), HERE) == (
        f"stage echo: pool echo comes from service echo, which runs on [{OTHER}], not on "
        f"this node's {HERE}")
    assert compat.stage_refusal(m, m.stage("elsewhere"), HERE) == (
        f"stage elsewhere: requires.platforms [{OTHER}] does not include this node's {HERE}")
    assert compat.stage_refusal(m, m.stage("plain"), HERE) is None


def test_version_names_the_core_and_protocols():
    r = cli("--version")
    assert r.returncode == 0, r
    assert r.stdout.strip() == (f"oarbank-agent {compat.AGENT_VERSION} (core "
                                f"{compat.CORE_VERSION}, protocols [1], {HERE})")


def test_the_agent_refuses_what_cannot_run_here_and_says_why_everywhere(start_agent, tmp_path):
    good = write_module(tmp_path / "good", stages=[
        {"name": "plain", "timeout_s": 60},
        {"name": "elsewhere", "timeout_s": 60, "requires": {"platforms": [OTHER]}}])
    netmod = write_module(tmp_path / "netmod", module_id="test.agent.netmod",
                          extra='\n[sandbox]\nnet = "host"\n')
    oldcore = write_module(tmp_path / "oldcore", module_id="test.agent.oldcore",
                           requires={"core": ">=3", "platforms": [OTHER]})
    agent = start_agent([good, netmod, oldcore])
    lines = {
        "test.agent.netmod": compat.refusal_line("test.agent.netmod", str(netmod), [
            '[sandbox].net = "host": this agent\'s sandbox gives every child no network '
            '(only net = "none" can be met)']),
        "test.agent.oldcore": compat.refusal_line("test.agent.oldcore", str(oldcore), [
            f"requires.platforms [{OTHER}] does not include this node's {HERE}",
            f'requires.core ">=3" does not allow this agent\'s core version '
            f"{compat.CORE_VERSION}"]),
    }
    # one line each on stderr at load
    log = agent.log().splitlines()
    for line in lines.values():
        assert log.count(line) == 1, agent.log()
    st = agent.status()
    assert st["modules_refused"] == lines
    assert (st["agent_version"], st["core_version"], st["platform"]) == (
        compat.AGENT_VERSION, compat.CORE_VERSION, HERE)
    assert [r["module"] for r in st["services"]] == ["test.agent.echo"]  # nothing of theirs
    assert not (agent.state_dir / "modules" / "test.agent.netmod").exists()
    human = cli("status", "--state-dir", str(agent.state_dir))
    assert f"REFUSED test.agent.netmod: {lines['test.agent.netmod']}" in human.stdout
    # jobs for them: refused at submit with the same text, nothing queued
    for name in ("netmod", "test.agent.oldcore"):
        module_id = "test.agent.netmod" if name == "netmod" else name
        r = cli("submit", "--state-dir", str(agent.state_dir), "--module", name, "--stage",
                "echo", "--payload", "{}")
        assert r.returncode == 2, r
        assert r.stderr.strip().endswith(lines[module_id]), r.stderr
    r = cli("submit", "--state-dir", str(agent.state_dir), "--module", "echo", "--stage",
            "elsewhere", "--payload", "{}")
    assert r.returncode == 2
    assert f"test.agent.echo: stage elsewhere: requires.platforms [{OTHER}]" in r.stderr
    reply = control.request(agent.state_dir, {"op": "submit", "module": "echo",
                                              "stage": "elsewhere", "payload": {}})
    assert reply["code"] == "unsupported_platform"
    assert agent.status()["jobs"] == []
    # the module that can run, runs
    assert agent.run_job("plain", {"x": 1})["state"] == "succeeded", json.dumps(st)
