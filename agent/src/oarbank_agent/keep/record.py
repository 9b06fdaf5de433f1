"""What the agent keeps of one endpoint service so the next agent can know it again: written by
the agent alone, from what the system and its own files say (never from what a service or job
wrote), and carried by the keeper, never by the state dir.

- identity: which process group (its record in ``<state>/procs``, written by the agent when
  it started it, says its leader's start time and the boot), and the daemon's pid with its
  start time as the system counts it (read by the agent when it keeps it);
- what it runs: the module's id and version, digests of its manifest and its settings, as
  they were when it was first kept (its start: a reload since does not change what it runs);
- where it stood: whether it says ``ready`` on its channel, its users and idle clock.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from oarbank_agent.modules.loaded import ModuleCtx

__all__ = ["KeptService", "settings_digest", "manifest_digest"]


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def settings_digest(ctx: ModuleCtx) -> str:
    """The module's settings on this node, as the agent loaded them."""
    return _digest(ctx.settings)


def manifest_digest(ctx: ModuleCtx) -> str:
    """The whole manifest as parsed, and the folder it was installed from."""
    return _digest({"bundle": str(ctx.manifest.bundle), "manifest": ctx.manifest.raw})


@dataclass(frozen=True)
class KeptService:
    key: str  # <module id>/<service>
    module_id: str
    version: str
    settings_digest: str
    manifest_digest: str
    group: str  # Group.key of its start op's group (its record in <state>/procs says the rest)
    pid: int  # the daemon: the pid its hello named, found in its group by the agent then
    pid_started: int | None  # that pid's start time as the system counts it
    says_ready: bool
    users: int
    idle_since: float | None  # unix time; None while it had users

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> KeptService:
        """Raises ValueError naming what is wrong (the keeper's copy is the agent's own, so a
        bad one means a different agent version wrote it: that service is not taken back)."""
        try:
            return cls(key=str(doc["key"]), module_id=str(doc["module_id"]),
                       version=str(doc["version"]),
                       settings_digest=str(doc["settings_digest"]),
                       manifest_digest=str(doc["manifest_digest"]),
                       group=str(doc["group"]), pid=int(doc["pid"]),
                       pid_started=(None if doc["pid_started"] is None
                                    else int(doc["pid_started"])),
                       says_ready=bool(doc["says_ready"]), users=int(doc["users"]),
                       idle_since=(None if doc["idle_since"] is None
                                   else float(doc["idle_since"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a kept record the agent cannot read ({exc!r})") from None
