"""The GPU APIs a manifest may name and a node may provide (contract section 5), and upstream's
runner-side helpers by their names (``from oarbank_sdk import gpu``). Standard library only.

    gpu.detect()                       # {"host": ["cuda"], "containers": [], "evidence": {...}}
    gpu.fits(["cuda", "vulkan"], ["vulkan"])   # True: one API in common
    gpu.unmet([{"apis": ["metal"], "where": "host"}], {"host": ["cuda"]})   # that group

``detect`` runs the agent's own probes (``gpuprobes``), for the APIs this OS can have, in this
process: a runner sees what it can reach from its sandbox, as the agent's report names them.
Unlike the agent it has no watchdog: a driver that hangs its init hangs the caller. The manifest
checker imports this module for ``GPU_APIS``; the probes (ctypes) load only when detecting.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["GPU_APIS", "KNOWN_APIS", "describe", "detect", "fits", "unmet"]

GPU_APIS = ("metal", "cuda", "rocm", "vulkan", "opencl", "directml")
KNOWN_APIS = tuple(sorted(GPU_APIS))  # upstream's name for the same set, sorted


def fits(any_of: Iterable[str] | None, have: Iterable[str] | None) -> bool:
    """Whether APIs ``have`` meet a need for any of ``any_of`` (no need is always met)."""
    need = set(any_of or ())
    return not need or bool(need & set(have or ()))


def unmet(needs: Iterable[Mapping[str, Any]], apis: Mapping[str, Any] | None
          ) -> list[Mapping[str, Any]]:
    """The groups of ``needs`` (``{apis, where}``; ``where`` is ``host`` or ``containers``)
    that a node offering ``apis`` (``{host: [...], containers: [...]}``) does not meet."""
    offered = apis or {}
    return [g for g in needs if not fits(g["apis"], offered.get(g["where"]) or ())]


def describe(group: Mapping[str, Any]) -> str:
    """``"one of cuda, rocm on the host"``, ``"vulkan in containers"``."""
    names = list(group["apis"])
    what = names[0] if len(names) == 1 else "one of " + ", ".join(names)
    return f"{what} {'in containers' if group.get('where') == 'containers' else 'on the host'}"


def _os_name() -> str:
    if sys.platform == "win32":
        return "windows"
    return "darwin" if sys.platform == "darwin" else "linux"


def detect() -> dict[str, Any]:
    """``{"host": [...], "containers": [], "evidence": {api: text}}``: the APIs this process
    reaches (sorted), none in containers (only an agent knows its container runtime), and for
    every known API what its probe found or why it is absent."""
    from . import gpuprobes

    candidates = gpuprobes.CANDIDATES[_os_name()]
    host: list[str] = []
    evidence: dict[str, str] = {}
    for api in KNOWN_APIS:
        if api not in candidates:
            evidence[api] = f"not probed: {_os_name()} does not have {api}"
            continue
        answer = gpuprobes.probe_api(api)
        evidence[api] = str(answer["why"])
        if answer["present"]:
            host.append(api)
    return {"host": sorted(host), "containers": [], "evidence": evidence}
