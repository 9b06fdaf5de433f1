"""Which GPU APIs this host provides (contract section 5), probed so a bad driver cannot hang us.

Each API is probed in its own child process (`python -m oarbank_agent.host.gpuapis --probe API`)
under a watchdog: a driver that hangs in its init, or crashes the process, costs one probe and
reads as absent, never a stuck agent. The probes themselves are ``oarbank_sdk.gpuprobes``'s,
the same ones a runner's ``oarbank_sdk.gpu.detect()`` runs in itself, so the two agree.

``--gpu-apis LIST`` on ``oarbank-agent run`` replaces detection (operators, tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field

from oarbank_sdk.gpu import GPU_APIS  # the contract's names, shared with the manifest checker
from oarbank_sdk.gpuprobes import CANDIDATES as _CANDIDATES
from oarbank_sdk.gpuprobes import PROBES as _PROBES
from oarbank_sdk.gpuprobes import probe_api

__all__ = ["GPU_APIS", "Detection", "detect", "from_override", "probe_api"]

PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Detection:
    """What the host provides, and how each API was found out (shown in ``status``)."""

    apis: tuple[str, ...]
    source: str  # "detected" or "override"
    probes: dict[str, str] = field(default_factory=dict)  # api -> "present" / "absent: why"

    def as_dict(self) -> dict:
        return {"apis": list(self.apis), "source": self.source, "probes": dict(self.probes)}


def from_override(value: str) -> Detection:
    """``--gpu-apis cuda,vulkan`` (or ``none`` / empty) -> a Detection. Raises ValueError."""
    names = [] if value.strip().lower() in ("", "none") else [v.strip() for v in value.split(",")]
    unknown = [n for n in names if n not in GPU_APIS]
    if unknown:
        raise ValueError(f"unknown GPU API {', '.join(unknown)} (known: {', '.join(GPU_APIS)})")
    return Detection(tuple(dict.fromkeys(names)), "override", {n: "override" for n in names})


def detect(timeout_s: float = PROBE_TIMEOUT_S) -> Detection:
    """Probe every API this OS can have, each in a child with a watchdog, all at once."""
    from oarbank_agent import platform as backends  # here: the probe child imports this module

    sessions = backends.current().sessions
    children: dict[str, subprocess.Popen] = {}
    probes: dict[str, str] = {}
    for api in _CANDIDATES.get(backends.name(), _CANDIDATES["linux"]):
        try:
            children[api] = sessions.start(
                [sys.executable, "-I", "-m", "oarbank_agent.host.gpuapis", "--probe", api],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            probes[api] = f"absent: probe could not start ({exc})"
    deadline = time.monotonic() + timeout_s
    for api, child in children.items():
        try:
            out, _ = child.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            sessions.kill_session(child.pid)
            child.communicate()
            probes[api] = f"absent: probe did not answer within {timeout_s:g} s (driver hangs?)"
            continue
        probes[api] = _read_probe_output(out, child.returncode)
    apis = tuple(a for a in GPU_APIS if probes.get(a) == "present")
    return Detection(apis, "detected", probes)


def _read_probe_output(out: bytes, returncode: int) -> str:
    lines = out.decode("utf-8", "replace").strip().splitlines()
    if returncode != 0 or not lines:
        return f"absent: probe exited {returncode}"
    try:
        answer = json.loads(lines[-1])
    except ValueError:
        return "absent: probe printed no answer"
    return "present" if answer.get("present") is True else f"absent: {answer.get('why', '?')}"


def _main(argv: list[str]) -> int:
    from oarbank_agent import platform as backends

    if backends.name() == "darwin":
        backends.current()  # the darwin profile's tripwire, in the probe child too
    if len(argv) == 2 and argv[0] == "--probe" and argv[1] in _PROBES:
        print(json.dumps(probe_api(argv[1])), flush=True)
        return 0
    if not argv:
        print(json.dumps(detect().as_dict(), indent=2))
        return 0
    print(f"usage: python -m oarbank_agent.host.gpuapis [--probe {'|'.join(_PROBES)}]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
