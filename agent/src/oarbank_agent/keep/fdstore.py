"""``--keep-services`` under systemd: the service manager's descriptor store holds what the
keeper process holds elsewhere, so nothing of the agent's has to outlive its unit.

For each ready endpoint service three descriptors are stored, named
``oarbank-keep.<id>.end`` (the agent's end of its channel), ``.log`` (the read end of its
stderr pipe, when it has one) and ``.rec`` (a memfd holding its record: written by the
agent alone, carried by systemd, never in the state dir). A newer record replaces the old
one (removed, then stored: a crash in between leaves an end without a record, which is
stopped, never trusted). systemd drops a stored descriptor on its own once it hangs up
(the service closed its side), and hands the rest back at the unit's next start; the agent
that takes them removes them from the store and stores again what it keeps.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket

from oarbank_agent import platform
from oarbank_agent.keep.link import Taken
from oarbank_agent.keep.record import KeptService
from oarbank_agent.platform.api import ServiceManager

__all__ = ["FdStoreLink", "take_from_store", "PREFIX"]

log = logging.getLogger("oarbank_agent.keep")

PREFIX = "oarbank-keep."
PARTS = ("end", "log", "rec")


def _stem(key: str) -> str:
    return PREFIX + hashlib.sha256(key.encode()).hexdigest()[:16]


def manager() -> ServiceManager | None:
    """The service manager that runs this agent and keeps descriptors, or None."""
    sm = platform.current().service_manager
    return sm if sm is not None and sm.active() else None


def take_from_store(sm: ServiceManager) -> Taken:
    """What a previous agent of this unit stored, by service key; foreign names are closed."""
    by_stem: dict[str, dict[str, int]] = {}
    for name, fd in sm.handed_back():
        stem, _, part = name.rpartition(".")
        if not name.startswith(PREFIX) or part not in PARTS or part in by_stem.get(stem, {}):
            log.warning("keep: a descriptor named %r handed back by the service manager is "
                        "not ours: closed", name)
            os.close(fd)
            continue
        by_stem.setdefault(stem, {})[part] = fd
    # The store's copies go: this agent holds them now and stores again what it keeps (a
    # service it stops must see its channel end, not the store's copy holding it open).
    for name in sorted({f"{stem}.{part}" for stem, fds in by_stem.items() for part in fds}):
        try:
            sm.notify({"FDSTOREREMOVE": "1", "FDNAME": name})
        except OSError as exc:
            log.warning("keep: could not remove %s from the service manager's store: %s",
                        name, exc)
    taken: Taken = {}
    for stem, fds in by_stem.items():
        end, log_fd, rec_fd = fds.get("end"), fds.get("log"), fds.get("rec")
        rec: KeptService | None = None
        key = stem
        if rec_fd is not None:
            try:
                doc = json.loads(sm.read_stored(rec_fd))
                if not isinstance(doc, dict):
                    raise ValueError("its record is not a kept service's")
                rec = KeptService.from_doc(doc)
                if _stem(rec.key) != stem:
                    raise ValueError(f"its record names another service ({rec.key})")
                key = rec.key
            except (ValueError, OSError) as exc:
                log.warning("keep: %s: %s: its service will be stopped", stem, exc)
                rec = None
            finally:
                os.close(rec_fd)
        if end is None:  # its service hung up: systemd dropped its end; nothing to take
            if log_fd is not None:
                os.close(log_fd)
            continue
        taken[key] = (rec, socket.socket(fileno=end), log_fd)
    if taken:
        log.info("keep: took %d channel end(s) from the service manager's store", len(taken))
    return taken


class FdStoreLink:
    """``KeeperLink``'s part (keep / note / drop) spoken to the service manager."""

    def __init__(self, sm: ServiceManager) -> None:
        self.sm = sm
        self._up = False
        self.pid: int | None = None  # no keeper process: the service manager holds them

    @property
    def up(self) -> bool:
        return self._up

    async def start(self) -> None:
        self._up = True
        log.info("keep: the service manager's descriptor store keeps the endpoint channels "
                 "across a restart of the unit")

    def _send(self, fields: dict[str, str], fds: tuple[int, ...] = ()) -> None:
        if not self._up:
            return
        try:
            self.sm.notify(fields, fds)
        except OSError as exc:
            log.warning("keep: the service manager did not take it (%s): services will not "
                        "be kept across a restart", exc)
            self._up = False

    def _store(self, name: str, fd: int) -> None:
        self._send({"FDSTORE": "1", "FDNAME": name}, (fd,))

    def _store_record(self, rec: KeptService) -> None:
        fd = self.sm.store_bytes("oarbank-keep-record", json.dumps(rec.to_doc()).encode())
        try:
            self._store(_stem(rec.key) + ".rec", fd)
        finally:
            os.close(fd)  # the store has its own duplicate

    def keep(self, rec: KeptService, fds: tuple[int, ...]) -> None:
        self.drop(rec.key)  # a service restarted since: only its newest end stays stored
        stem = _stem(rec.key)
        for part, fd in zip(("end", "log")[:len(fds)], fds, strict=True):
            self._store(f"{stem}.{part}", fd)
        self._store_record(rec)

    def note(self, rec: KeptService) -> None:
        self._send({"FDSTOREREMOVE": "1", "FDNAME": _stem(rec.key) + ".rec"})
        self._store_record(rec)

    def drop(self, key: str) -> None:
        for part in PARTS:
            self._send({"FDSTOREREMOVE": "1", "FDNAME": f"{_stem(key)}.{part}"})

    def close(self) -> None:
        self._up = False  # the store keeps what it holds; the next start gets it back
