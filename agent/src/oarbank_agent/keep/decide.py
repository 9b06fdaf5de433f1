"""Whether a restarted agent takes a kept endpoint service back (pure).

A service is taken back only when every fact below proves it is the one the agent kept, and
that it runs what this agent would start now; otherwise it is stopped, as without
``--keep-services``. Each fact comes from the system or the agent's own files:

1. the agent runs with ``--keep-services``;
2. its module is loaded here, enabled, with the same id, version, manifest and settings;
3. its process group is alive, and the daemon is the same process: the pid is in the group
   and started when it did (an unknown start time proves nothing);
4. the agent's end of its channel came back from the keeper, and the service has not closed
   its side.
"""

from __future__ import annotations

from dataclasses import dataclass

from oarbank_agent.keep.record import KeptService

__all__ = ["Now", "Verdict", "decide"]


@dataclass(frozen=True)
class Now:
    """What the restarted agent observes of one kept service."""

    keeping: bool  # --keep-services on this agent
    loaded: bool  # a loaded endpoint service of this key
    disabled: bool
    version: str | None
    settings_digest: str | None
    manifest_digest: str | None
    group_alive: bool
    pid_in_group: bool
    pid_started: int | None  # the pid's start time now (None: gone, or the system cannot say)
    end_present: bool
    end_open: bool


@dataclass(frozen=True)
class Verdict:
    adopt: bool
    why: str


def decide(kept: KeptService, now: Now) -> Verdict:
    """Adopt only when provably the same; the first fact that fails is the reason to stop."""
    checks = (
        (now.keeping, "this agent runs without --keep-services"),
        (now.loaded, "its module is no longer loaded here (or it is no endpoint service)"),
        (not now.disabled, "its module is disabled"),
        (now.version == kept.version,
         f"its module's version changed ({kept.version} -> {now.version})"),
        (now.manifest_digest == kept.manifest_digest, "its module's manifest changed"),
        (now.settings_digest == kept.settings_digest, "its settings changed"),
        (now.end_present, "its channel's end did not come back from the keeper"),
        (now.end_open, "it closed its channel"),
        (now.group_alive, "its process group is gone (or the previous agent never recorded it)"),
        (now.pid_in_group, f"pid {kept.pid} is no longer in its process group"),
        (kept.pid_started is not None and now.pid_started is not None,
         "the system cannot say when its pid started: it cannot be proven the same"),
        (now.pid_started == kept.pid_started,
         f"pid {kept.pid} is another process now (it started at another time)"),
    )
    for ok, why in checks:
        if not ok:
            return Verdict(False, why)
    return Verdict(True, f"the same process (pid {kept.pid}), module {kept.module_id} "
                         f"{kept.version}, same manifest and settings, its channel kept")
