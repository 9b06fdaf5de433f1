"""The environments a node gives a module's processes (contract sections 2 and 4), built here
once: the agent and the conformance kit (which plays the agent) both call these.

- ``op_env``: every service op's environment, exactly: the module's data dir (``HOME`` and
  ``TMPDIR`` inside it), the module and service, the node id and platform token, the settings,
  limits and tools files; plus ``extra`` (the agent adds the endpoint features it offers).
- ``runner_env``: a runner's environment: the manifest's ``[runner].env`` first, then the
  attempt's workdir (``TMPDIR``, ``HOME`` inside it), the module's data dir, platform, module,
  attempt id, runner protocol, settings file, ``PYTHONUTF8``; one ``OARBANK_POOL_<POOL>_TOKENS``
  per reserved pool and one ``OARBANK_SERVICE_<NAME>`` per connector given.

A child inherits nothing else: its environment is exactly one of these. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["RUNNER_PROTOCOL", "op_env", "runner_env", "pool_env_name", "service_env_name"]

RUNNER_PROTOCOL = "1"  # OARBANK_PROTOCOL: the runner protocol of contract section 4


def pool_env_name(pool: str) -> str:
    """``OARBANK_POOL_<POOL>_TOKENS``: how many tokens of ``pool`` the attempt holds."""
    return f"OARBANK_POOL_{pool.upper()}_TOKENS"


def service_env_name(service: str) -> str:
    """``OARBANK_SERVICE_<NAME>``: the attempt's connector to ``service``."""
    return "OARBANK_SERVICE_" + service.upper()


def op_env(*, module: str, service: str, node_id: str, platform: str, data_dir: Path,
           settings_file: Path, limits_file: Path, tools_file: Path,
           extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The exact environment of a service op (contract section 2)."""
    env = {
        "OARBANK_MODULE_DATA": str(data_dir),
        "OARBANK_MODULE": module,
        "OARBANK_SERVICE": service,
        "OARBANK_NODE_ID": node_id,
        "OARBANK_PLATFORM": platform,
        "OARBANK_SETTINGS_FILE": str(settings_file),
        "OARBANK_LIMITS_FILE": str(limits_file),
        "OARBANK_TOOLS_FILE": str(tools_file),
        "HOME": str(data_dir / "home"),
        "TMPDIR": str(data_dir / "tmp"),
    }
    env.update(extra or {})
    return env


def runner_env(*, module: str, attempt_id: str, workdir: Path, data_dir: Path, platform: str,
               settings_file: Path, pools: Mapping[str, int],
               manifest_env: Mapping[str, str] | None = None,
               connectors: Mapping[str, str] | None = None) -> dict[str, str]:
    """The exact environment of a runner (contract section 4). ``manifest_env``: the
    manifest's ``[runner].env`` (the contract's variables win over it); ``connectors``:
    service name -> the connector's handle value."""
    env = dict(manifest_env or {})
    env.update({
        "OARBANK_WORKDIR": str(workdir),
        "OARBANK_TMP": str(workdir / "tmp"),
        "TMPDIR": str(workdir / "tmp"),
        "HOME": str(workdir / "home"),
        "OARBANK_MODULE_DATA": str(data_dir),
        "OARBANK_PLATFORM": platform,
        "OARBANK_MODULE": module,
        "OARBANK_ATTEMPT_ID": attempt_id,
        "OARBANK_PROTOCOL": RUNNER_PROTOCOL,
        "OARBANK_SETTINGS_FILE": str(settings_file),
        "PYTHONUTF8": "1",
    })
    for pool, tokens in pools.items():
        env[pool_env_name(pool)] = str(tokens)
    for service, value in (connectors or {}).items():
        env[service_env_name(service)] = value
    return env
