"""``--keep-services`` in the agent's run: what it takes back at start (``take``, before the
predecessor's groups are ended), the decision on each (``readopt``, after the first
fingerprints: ``decide.py``), and while it runs, the keeper told of every ready endpoint
service and of every one that stops (``start``, ``changed``); at shutdown, the kept ones are
left running (``let_go``).

Under systemd (``$NOTIFY_SOCKET``) the service manager's descriptor store holds the ends
instead of a keeper process (``fdstore.py``); what a keeper holds is taken as well.

Without the flag the agent still takes what a keeper or the store holds, and stops each
service: the contract's rule, and no keeper is left behind.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from oarbank_agent import platform, procs
from oarbank_agent.keep import decide as decision
from oarbank_agent.keep import fdstore
from oarbank_agent.keep.link import KeeperLink, Taken, take_over
from oarbank_agent.keep.record import KeptService, manifest_digest, settings_digest
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services import servicelog

if TYPE_CHECKING:
    from oarbank_agent.broker.channel import Channel
    from oarbank_agent.platform.api import Group
    from oarbank_agent.services.runtime import ServiceRuntime
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["Keeping"]

log = logging.getLogger("oarbank_agent.keep")

GRACE_S = 2.0  # a kept service that is not taken back: its group's grace, as for leftovers


def _log_path(rt: ServiceRuntime) -> Path:
    return rt.ctx.log_dir / f"{rt.svc.name}.log"


class Keeping:
    def __init__(self, state_dir: Path, sup: Supervisor, registry: procs.ProcessRegistry, *,
                 enabled: bool) -> None:
        self.state_dir = state_dir
        self.sup = sup
        self.registry = registry
        self.enabled = enabled
        self.manager = fdstore.manager()
        self.link: KeeperLink | fdstore.FdStoreLink = (
            fdstore.FdStoreLink(self.manager) if self.manager is not None
            else KeeperLink(state_dir))
        self._taken: Taken = {}
        # service key -> (the channel the keeper holds a copy of, the record it has)
        self._held: dict[str, tuple[Channel, KeptService]] = {}

    # --- at start ---------------------------------------------------------------------------

    def take(self) -> frozenset[str]:
        """What a previous agent's keeper holds; the keys whose groups are spared for now."""
        self._taken = {}
        if self.manager is not None:
            self._taken = fdstore.take_from_store(self.manager)
        try:
            from_keeper = take_over(self.state_dir)
        except (ConnectionError, OSError) as exc:
            log.warning("keeper: could not take what it holds (%s): its services are "
                        "ended with the previous agent's groups", exc)
            from_keeper = {}
        for key, (rec, end, log_fd) in from_keeper.items():
            if key in self._taken:  # the store's is the newer: this agent's unit wrote it
                end.close()
                if log_fd is not None:
                    os.close(log_fd)
            else:
                self._taken[key] = (rec, end, log_fd)
        return frozenset(k for k, (rec, _end, _log) in self._taken.items() if rec is not None)

    def _group(self, rec: KeptService) -> procs.GroupRecord | None:
        """The group as the previous agent registered it when it started it (its leader's
        start time and boot from the system): the kept record only says which one."""
        for r in self.registry.records():
            if (r.kind == "service" and r.label.rsplit(" ", 1)[0] == rec.key
                    and r.group.key == rec.group):
                return r
        return None

    def _now(self, rec: KeptService, rt: ServiceRuntime | None, group: Group | None,
             end: socket.socket) -> decision.Now:
        host = platform.current().keeper
        loaded = rt is not None and rt.svc.endpoint
        alive = group is not None and group.alive()
        return decision.Now(
            keeping=self.enabled, loaded=loaded,
            disabled=bool(rt is not None and rt.st.disabled),
            version=rt.ctx.manifest.version if rt is not None else None,
            settings_digest=settings_digest(rt.ctx) if rt is not None else None,
            manifest_digest=manifest_digest(rt.ctx) if rt is not None else None,
            group_alive=alive, pid_in_group=group is not None and alive and group.owns(rec.pid),
            pid_started=host.started(rec.pid) if host is not None else None,
            end_present=True, end_open=host is not None and not host.peer_gone(end))

    async def readopt(self) -> frozenset[str]:
        """Adopt each taken service proven the same; stop the others. The adopted keys."""
        adopted: set[str] = set()
        for key, (rec, end, log_fd) in self._taken.items():
            if rec is None:
                end.close()  # unreadable: its group was not spared, it is ended already
                if log_fd is not None:
                    os.close(log_fd)
                continue
            rt = self.sup.services.get(key)
            registered = self._group(rec)
            group = registered.group if registered is not None else None
            now = self._now(rec, rt, group, end)
            log.debug("%s: kept %s; observed now %s", key, rec, now)
            verdict = decision.decide(rec, now)
            if verdict.adopt and rt is not None and group is not None:
                log.warning("%s: taken back after the agent restart: %s", key, verdict.why)
                platform.current().groups.adopt(group)
                if log_fd is not None:  # its stderr reaches its log again
                    servicelog.get(_log_path(rt)).resume(log_fd)
                ch = self.sup.channels.adopt(key, end, rec.pid, rec.says_ready)
                self.sup.adopt_endpoint(rt, ch, group, rec.idle_since)
                adopted.add(key)
                continue
            log.warning("%s: kept across the agent restart, now stopped: %s", key, verdict.why)
            end.close()  # the service sees its channel end
            if log_fd is not None:
                if rt is not None:  # its last words (a stop) still reach its log
                    servicelog.get(_log_path(rt)).resume(log_fd)
                else:
                    os.close(log_fd)
            if group is not None:
                await group.end(GRACE_S)
                self.registry.remove(group)
        self._taken = {}
        return frozenset(adopted)

    async def start(self) -> None:
        """Own a keeper and tell it of every ready endpoint service from now on."""
        if not self.enabled:
            return
        try:
            await self.link.start()
        except OSError as exc:
            log.warning("keeper: %s: services will not be kept across a restart", exc)
            return
        self.sup.on_change.append(self.changed)
        for key in list(self.sup.services):
            self.changed(key)

    # --- while it runs ----------------------------------------------------------------------

    def _record(self, rt: ServiceRuntime, ch: Channel, pid_started: int | None) -> KeptService:
        return KeptService(
            key=rt.key, module_id=rt.ctx.id, version=rt.ctx.manifest.version,
            settings_digest=settings_digest(rt.ctx), manifest_digest=manifest_digest(rt.ctx),
            group=rt.group.key if rt.group is not None else "",
            pid=ch.hello.result(), pid_started=pid_started, says_ready=ch.ready_said.done(),
            users=rt.st.users, idle_since=rt.st.idle_since)

    def changed(self, key: str) -> None:
        """A service changed: the keeper keeps a ready endpoint service's channel (and its
        newest record), and lets go of one that is no longer ready."""
        if not self.link.up:
            return
        rt = self.sup.services.get(key)
        ch = rt.channel if rt is not None else None
        held = self._held.get(key)
        if (rt is not None and rt.svc.endpoint and rt.st.state is lc.State.READY
                and ch is not None and ch.usable and rt.group is not None):
            host = platform.current().keeper
            if held is not None and held[0] is ch:
                # Where it stands changed (users, idle clock); what it runs is what it was
                # started with: a settings file reloaded since does not make it the new one.
                rec = replace(self._record(rt, ch, held[1].pid_started),
                              settings_digest=held[1].settings_digest,
                              manifest_digest=held[1].manifest_digest,
                              version=held[1].version)
                if rec != held[1]:
                    self.link.note(rec)
            else:
                pid = ch.hello.result()
                if not rt.group.owns(pid):  # its hello named a pid: the system's word on it
                    log.info("%s: not kept across a restart: its hello's pid %d is not in its "
                             "process group", key, pid)
                    return
                started = host.started(pid) if host is not None else None
                rec = self._record(rt, ch, started)
                reader = servicelog.get(_log_path(rt)).latest_reader()
                self.link.keep(rec, (ch.agent_fd,) if reader is None else (ch.agent_fd, reader))
            self._held[key] = (ch, rec)
        elif held is not None:
            del self._held[key]
            self.link.drop(key)

    # --- at shutdown ------------------------------------------------------------------------

    def let_go(self) -> None:
        """Before the services are stopped: the ones the keeper holds are left running."""
        if not self.link.up:
            return
        for key, (ch, _rec) in list(self._held.items()):
            rt = self.sup.services.get(key)
            if rt is not None and rt.channel is ch and ch.usable and not rt.busy():
                del self._held[key]
                self.sup.let_go(rt)

    def close(self) -> None:
        self.link.close()
