"""Reload: a reload request (``platform.api.Requests``) or ``oarbank-agent reload`` while the
agent runs.

Re-reads the config file and the ``--settings`` files (``read``: cli.py builds it, the same
merge as at start), then:

- settings given there are written to ``settings.json`` where they differ (an explicit
  change); a module without any keeps its file, re-read so an operator's edit counts;
- the services' timing overrides are applied (overrides.py): an idle timer is measured again
  at once with the new ``idle_timeout_s``;
- every service is fingerprinted again (settings may change its pools or health).

What cannot change while the agent runs (state dir, modules, node id, sandbox, logging, ...)
is left as it is, with one WARNING naming each such option: it needs a restart. A file that
cannot be read or has a bad value changes nothing (the error is the answer).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from oarbank_agent.modules.loaded import read_settings_file, write_settings
from oarbank_agent.services import overrides

if TYPE_CHECKING:
    from oarbank_agent.modules.loaded import ModuleCtx
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["Reloaded", "reload"]

log = logging.getLogger("oarbank_agent.operate.reload")


@dataclass
class Reloaded:
    """What ``read`` gives: the settings and overrides now, and the options that changed but
    only take effect on a restart."""

    settings: dict[str, dict[str, Any]]
    services: dict[str, dict[str, Any]]
    restart_needed: list[str] = field(default_factory=list)


async def reload(supervisor: Supervisor, modules: Mapping[str, ModuleCtx],
                 find_module: Callable[[str], ModuleCtx | None],
                 read: Callable[[], Reloaded]) -> list[str]:
    """Apply what ``read`` says to the loaded ``modules`` (``find_module``: by id or short
    name) and the ``supervisor``'s services; returns the changes, one line each. Raises
    ValueError (the config's or an override's error) before anything is changed."""
    new = read()
    for name in new.settings:
        if find_module(name) is None:
            raise ValueError(f"settings for a module that is not loaded: {name}")
    # The manifest's own service (the runtime's may carry earlier overrides): every service
    # the supervisor runs is declared in its module's manifest.
    manifest_services = {key: svc for key, rt in supervisor.services.items()
                         if (svc := rt.ctx.manifest.service(rt.svc.name)) is not None}
    # Checked in full first: a bad value leaves every timing as it was.
    for key, table in new.services.items():
        if key in manifest_services:
            overrides.check(key, manifest_services[key], table)
    changes = []
    for ctx in modules.values():
        given = new.settings.get(ctx.id, new.settings.get(ctx.manifest.short_name))
        if given is not None:
            if write_settings(ctx, given):
                changes.append(f"{ctx.id}: settings.json written")
        else:
            ctx.settings = read_settings_file(ctx.settings_file)
    changes += overrides.apply(supervisor, new.services,
                               manifest_services, live=True)
    for opt in new.restart_needed:
        log.warning("reload: %s changed; it takes effect only when the agent restarts", opt)
    await asyncio.gather(*(supervisor.fingerprint(rt)
                           for rt in supervisor.services.values()))
    changes.append(f"fingerprinted {len(supervisor.services)} service(s) again")
    for line in changes:
        log.info("reload: %s", line)
    return changes
