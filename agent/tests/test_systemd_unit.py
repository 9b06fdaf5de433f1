"""The systemd unit shipped with the agent (agent/systemd/oarbank-agent.service) and its
config file example: `systemd-analyze verify` finds nothing to say, the options the agent
relies on are there, the hardening leaves the sandbox's needs alone, and the example config
is one `run` takes."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

from agent_helpers import EXAMPLE, REPO

from oarbank_agent.modules.loaded import read_settings_arg
from oarbank_agent.operate import config, run_options

UNIT = REPO / "agent" / "systemd" / "oarbank-agent.service"
EXAMPLE_CONFIG = REPO / "agent" / "systemd" / "agent.toml"
KEEP_DROP_IN = REPO / "agent" / "systemd" / "keep-services.conf"
INSTALLED = "/opt/oarbank/venv/bin/oarbank-agent"


def _service() -> dict[str, str]:
    p = configparser.ConfigParser(strict=False, interpolation=None)
    p.optionxform = str  # type: ignore[assignment,method-assign]
    p.read_string(UNIT.read_text())
    return dict(p["Service"])


def test_systemd_analyze_verify_is_silent(system_package, tmp_path: Path) -> None:
    system_package("systemd")
    # The one change: ExecStart names this checkout's agent (verify wants an executable
    # there; on a node it is the venv the README installs).
    exe = Path(sys.executable).parent / "oarbank-agent"  # the console script of this venv
    assert exe.exists(), exe
    text = UNIT.read_text()
    assert text.count(INSTALLED) == 1
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace(INSTALLED, str(exe)))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                       text=True, timeout=120)
    # verify exits 0 even for an unknown key or a bad value ("..., ignoring"): any word
    # from it is a failure.
    assert r.returncode == 0 and r.stdout + r.stderr == "", (r.stdout, r.stderr)
    # With the --keep-services drop-in (verify reads no drop-in folder here: the unit and
    # the drop-in in one file, the drop-in's lines last, as systemd applies them).
    unit.write_text(text.replace(INSTALLED, str(exe)) + "\n" + KEEP_DROP_IN.read_text())
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout + r.stderr == "", (r.stdout, r.stderr)
    # ... and it does speak up (the check is not empty).
    unit.write_text(text.replace(INSTALLED, str(exe)).replace("KillMode=mixed",
                                                                "KillMode=gently"))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                       text=True, timeout=120)
    assert "kill mode" in r.stderr


def test_the_unit_keeps_what_the_agent_needs() -> None:
    s = _service()
    assert s["Delegate"] == "yes"  # a cgroup per attempt and service
    assert s["KillMode"] == "mixed" and s["KillSignal"] == "SIGTERM"  # the agent drains
    assert float(s["TimeoutStopSec"]) > 30  # more than the default --drain-s
    assert s["StateDirectory"] == "oarbank-agent" and s["StateDirectoryMode"] == "0700"
    assert s["Restart"] == "on-failure" and s["RestartPreventExitStatus"] == "2"
    assert s["ExecReload"] == "/bin/kill -HUP $MAINPID"
    # The agent says when it is ready itself; its kept channels go in the descriptor store.
    assert s["Type"] == "notify" and s["NotifyAccess"] == "main"
    assert int(s["FileDescriptorStoreMax"]) >= 3 * 16  # three per kept service
    assert s["ExecStart"] == f"{INSTALLED} run --config {config.DEFAULT_PATH}"
    # Hardening that would break the sandbox or containment is absent.
    for key in ("RestrictNamespaces", "ProtectControlGroups", "PrivateDevices",
                "MemoryDenyWriteExecute", "SystemCallFilter", "PrivateNetwork",
                "DynamicUser"):
        assert key not in s, key
    assert "AF_UNIX" in s["RestrictAddressFamilies"]


def test_the_example_config_is_one_run_takes(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(EXAMPLE_CONFIG.read_text().replace("/opt/oarbank/modules/modelserver",
                                                      str(EXAMPLE)))
    ra = config.load_run_args(["--config", str(cfg)], run_options.run_options,
                              read_settings_arg)
    assert ra.args.state_dir == Path("/var/lib/oarbank-agent")
    assert ra.args.modules == [EXAMPLE] and ra.args.log_format == "json"
    assert ra.settings == {"modelserver": {"slots": 2}}
    assert ra.services == {"dev.example.modelserver/model": {"idle_timeout_s": 300}}


def test_the_keep_services_drop_in_leaves_the_services_to_the_agent() -> None:
    p = configparser.ConfigParser(strict=False, interpolation=None)
    p.optionxform = str  # type: ignore[assignment,method-assign]
    p.read_string(KEEP_DROP_IN.read_text())
    # Only the kill mode: signals go to the agent alone; the rest of the unit stays as is.
    assert dict(p["Service"]) == {"KillMode": "process"}
    assert p.sections() == ["Service"]
