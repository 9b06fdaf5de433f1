"""Can a module run on this node? The pure match of a manifest against the node (contract
section 1.2), made once at load (a module refused) and at submit (a stage refused).

What is matched, and why each refusal rather than a quiet load:

- ``requires.platforms``: this node's ``<os>-<arch>`` token must be listed (an empty or absent
  list allows every platform);
- ``requires.core``: the contract version this agent implements (``CORE_VERSION``) must be in
  the range; ``requires.agent``: this agent's own version (``AGENT_VERSION``);
- ``requires.runner_protocol`` (when the module has stages) and ``requires.service_protocol``
  (when it has services) must list 1, the only protocol this agent speaks;
- ``[sandbox]``: every child runs with no network and only its own folders, so a ``net``
  other than ``"none"``, or any ``folders`` or ``containers`` asked for, cannot be met; loading
  the module anyway would fail its jobs later with a stranger error;
- ``[results].max_inline_kb`` (the section the checker passes over), when given, must be a
  positive number: it bounds the ``result.json`` the agent reads (``max_inline_kb``);
- a service whose ``platforms`` exclude this node is not run here: an ``always`` one refuses
  the module (it would be started with the agent), and a stage using its pools is refused at
  submit, as is a stage whose own ``requires.platforms`` exclude the node.

Every text is made here, once: the agent prints it at load, ``status`` lists it, and a submit
answers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any

from oarbank_sdk import advice
from oarbank_sdk import manifest as mf
from oarbank_sdk.versions import RangeError, allows

__all__ = ["AGENT_VERSION", "CORE_VERSION", "PROTOCOL", "Node", "this_node",
           "module_refusals", "stage_refusal", "refusal_line", "version_line", "max_inline_kb"]

CORE_VERSION = "2.5"  # the contract (core) version this agent implements
PROTOCOL = 1  # the one runner and service protocol this agent speaks
try:
    AGENT_VERSION = metadata.version("oarbank-agent")
except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    AGENT_VERSION = "0.1.0"


@dataclass(frozen=True)
class Node:
    """What a manifest is matched against."""

    platform: str  # e.g. linux-amd64
    core: str = CORE_VERSION
    agent: str = AGENT_VERSION


def this_node() -> Node:
    return Node(mf.platform_token())


def version_line() -> str:
    """``oarbank-agent --version``: the agent's version and what it matches manifests with."""
    return (f"oarbank-agent {AGENT_VERSION} (core {CORE_VERSION}, protocols [{PROTOCOL}], "
            f"{mf.platform_token()})")


def module_refusals(m: mf.Manifest, node: Node) -> list[str]:
    """Why the module cannot run on ``node`` (empty: it can), one reason per need not met."""
    req: dict[str, Any] = m.raw.get("requires") or {}
    why: list[str] = []
    platforms = req.get("platforms") or []
    if platforms and node.platform not in platforms:
        why.append(f"requires.platforms {_list(platforms)} does not include this node's "
                   f"{node.platform}")
    for key, have, what in (("core", node.core, "core version"),
                            ("agent", node.agent, "agent version")):
        rng = req.get(key)
        if isinstance(rng, str) and not _allows(rng, have):
            why.append(f'requires.{key} "{rng}" does not allow this agent\'s {what} {have}')
    for key, needed in (("runner_protocol", bool(m.stages)),
                        ("service_protocol", bool(m.services))):
        listed = req.get(key)
        if needed and listed is not None and PROTOCOL not in listed:
            why.append(f"requires.{key} {_list(listed)} does not list {PROTOCOL}, the only "
                       f"{key.replace('_', ' ')} this agent speaks")
    why += _sandbox_refusals(m.sandbox)
    kb = _inline_kb(m)
    if isinstance(kb, str):
        why.append(kb)
    for svc in m.services:
        if svc.lifecycle == "always" and svc.platforms and node.platform not in svc.platforms:
            why.append(f"services.{svc.name} (lifecycle always) runs on {_list(svc.platforms)}, "
                       f"not on this node's {node.platform}")
    return why


def stage_refusal(m: mf.Manifest, stage: mf.Stage, platform: str) -> str | None:
    """Why a job of ``stage`` can never run on this node (None: it can)."""
    if stage.platforms and platform not in stage.platforms:
        return (f"stage {stage.name}: requires.platforms {_list(stage.platforms)} does not "
                f"include this node's {platform}")
    for pool in (*stage.pools, *stage.needs_pools):
        svc = m.service_for_pool(pool)
        if svc is not None and svc.platforms and platform not in svc.platforms:
            return (f"stage {stage.name}: pool {pool} comes from service {svc.name}, which "
                    f"runs on {_list(svc.platforms)}, not on this node's {platform}")
    return None


def refusal_line(module_id: str, where: str, reasons: list[str]) -> str:
    """The one line said at load, listed in ``status`` and answered to a submit."""
    return f"{module_id} ({where}): cannot run on this node: " + "; ".join(reasons)


def max_inline_kb(m: mf.Manifest) -> float:
    """The most KiB of ``result.json`` the agent reads (``[results].max_inline_kb``, default
    256); a module with a bad value is refused at load, so this only sees good ones."""
    kb = _inline_kb(m)
    return kb if isinstance(kb, float) else float(advice.RESULT_INLINE_KB)


def _inline_kb(m: mf.Manifest) -> float | str:
    """The value, or why it is wrong."""
    results = m.raw.get("results")
    value = results.get("max_inline_kb") if isinstance(results, dict) else None
    if value is None:
        return float(advice.RESULT_INLINE_KB)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return (f"[results].max_inline_kb must be a positive number of KiB, got {_show(value)}"
                f" (default {advice.RESULT_INLINE_KB})")
    return float(value)


def _sandbox_refusals(sandbox: dict[str, Any]) -> list[str]:
    why = []
    net = sandbox.get("net")
    if isinstance(net, dict) and net.get("mode") == "none" and not net.get("allow"):
        net = "none"  # upstream's table form of the same: no network
    if net is not None and net != "none":
        why.append(f"[sandbox].net = {_show(net)}: this agent's sandbox gives every child no "
                   'network (only net = "none" can be met)')
    for key in ("folders", "containers"):
        if sandbox.get(key):
            why.append(f"[sandbox].{key} = {_show(sandbox[key])}: this agent's sandbox grants "
                       f"no {key} (a child reaches only its own workdir or data dir)")
    return why


def _allows(rng: str, version: str) -> bool:
    try:
        return allows(rng, version)
    except RangeError:  # the checker refused such a manifest already; never load it here
        return False


def _list(values: Any) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)
