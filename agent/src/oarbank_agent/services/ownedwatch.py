"""Owned objects are reaped (G6): each service's ``list_owned`` every 60 s, and a service's
whenever an attempt that reached it ends, then ``destroy <id> --force`` for each object whose
attempt is over.

Only the services an ended attempt reached are asked then: a service learns an attempt's
number from its channel alone (a ``connection``), so it cannot have made an object for an
attempt that never connected to it. An attempt that reached no service asks nothing (each op
is a process start: the bench's trivial jobs paid three per burst); the 60 s round asks every
service, whatever it holds from before.

A service may create objects outside its data dir for an attempt (a scratch volume, a
container, a lease). ``list_owned`` answers ``{"objects": [...]}``; the contract leaves an
object's shape open, so the agent acts only on what it can prove: an object
``{"id": "<id>", "attempt": <n>}`` whose ``attempt`` is a wire attempt number (the integer
the service saw on its channel, contract 3.4) already given on this state dir (by this agent
or a predecessor: the numbers continue) and not running now. Objects without an attempt, with
one still running, or with a number never given are left alone: a
wrong ``destroy`` would break a running job. Which objects go is the pure ``to_destroy``.
Manual services are left to whoever runs them.

A module being removed (``module remove``, moduleremove.py) has nothing running any more: every
object its services list with an ``id`` is destroyed (``owned_ids``, ``destroy_all``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from oarbank_agent.eventwait import wait_event
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services import ops

if TYPE_CHECKING:
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["DEBOUNCE_S", "INTERVAL_S", "Reaper", "destroy_all", "owned_ids", "to_destroy"]

log = logging.getLogger("oarbank_agent.services.ownedwatch")

# After an attempt ends, the reaper waits this long before its round: the attempts that end in
# the meantime (a burst of jobs finishing together) are folded into that one round of
# `list_owned` ops instead of one round each (each op is a process start).
DEBOUNCE_S = 0.25

INTERVAL_S = 60.0


def to_destroy(objects: Any, live: set[int], last_given: int) -> tuple[list[str], str | None]:
    """(the ids to destroy, why the answer could not be read or None). ``live``: wire numbers
    of attempts not ended; ``last_given``: the highest wire number given so far."""
    if not isinstance(objects, list):
        return [], f"list_owned: 'objects' must be a list, got {type(objects).__name__}"
    out = []
    for obj in objects:
        if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
            continue  # not one the agent can name: left alone
        attempt = obj.get("attempt")
        if (isinstance(attempt, int) and not isinstance(attempt, bool)
                and 0 < attempt <= last_given and attempt not in live):
            out.append(obj["id"])
    return out, None


def owned_ids(objects: Any) -> tuple[list[str], int, str | None]:
    """Every object's id (its module is being removed: no attempt of it runs any more), how
    many objects have no id the agent can name (left alone), and why the answer could not be
    read (or None)."""
    if not isinstance(objects, list):
        return [], 0, f"list_owned: 'objects' must be a list, got {type(objects).__name__}"
    ids = [o["id"] for o in objects if isinstance(o, dict) and isinstance(o.get("id"), str)]
    return ids, len(objects) - len(ids), None


async def destroy_all(sup: Supervisor, rt: Any) -> list[str]:
    """``list_owned``, then ``destroy <id> --force`` for every object it names (a removed
    module's service, stopped). Returns one line per problem (each also logged)."""
    res = await ops.run_op(rt.ctx, sup.node, rt.svc.name, "list_owned",
                           timeout_s=ops.OP_TIMEOUTS["list_owned"], registry=sup.registry)
    if not res.ok or res.doc is None:
        log.info("%s: list_owned: %s (nothing destroyed)", rt.key, res.error)
        return []  # the op is optional for a module
    ids, nameless, problem = owned_ids(res.doc.get("objects", []))
    problems = [p for p in (problem,) if p is not None]
    if nameless:
        problems.append(f"{nameless} owned object(s) without an 'id' left alone")
    for oid in ids:
        done = await ops.run_op(rt.ctx, sup.node, rt.svc.name, "destroy",
                                timeout_s=ops.OP_TIMEOUTS["destroy"], registry=sup.registry,
                                args=(oid, "--force"))
        if done.ok:
            log.info("%s: destroyed owned object %s (its module is removed)", rt.key, oid)
        else:
            problems.append(f"destroy {oid} --force failed: {done.error}")
    for p in problems:
        log.warning("%s: %s", rt.key, p)
    return problems


class Reaper:
    """Runs ``list_owned`` for every service (each in turn) every ``interval_s``, and for the
    services named when ``poke``d (an attempt that reached them ended)."""

    def __init__(self, sup: Supervisor, attempts: Callable[[], tuple[set[int], int]],
                 interval_s: float = INTERVAL_S, debounce_s: float = DEBOUNCE_S) -> None:
        self.sup = sup
        self.attempts = attempts
        self.interval_s = interval_s
        self.debounce_s = debounce_s
        self.rounds = 0  # rounds run (each: one list_owned per service asked)
        self._wake = asyncio.Event()
        self._poked: set[str] = set()  # service keys reached by attempts ended since a round
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="owned objects")

    def poke(self, service_keys: Iterable[str]) -> None:
        """Attempts that reached ``service_keys`` ended: those are asked in the next round."""
        keys = set(service_keys)
        if keys:
            self._poked |= keys
            self._wake.set()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            poked = await wait_event(self._wake, self.interval_s)
            if poked:
                # Poked: the attempt ends of the next debounce_s fold into this round (the
                # event is cleared only after the wait, so their pokes set it to no effect).
                await asyncio.sleep(self.debounce_s)
            self._wake.clear()
            asked, self._poked = self._poked, set()
            self.rounds += 1
            for key, rt in list(self.sup.services.items()):
                if poked and key not in asked:
                    continue  # no ended attempt reached it: nothing new to reap there
                # A service with no GPU API here runs no op at all, and a manual one is its
                # operator's: the agent only fingerprints it (contract 2.3).
                if (self.sup.shutting_down or rt.st.gpu_missing is not None
                        or rt.svc.lifecycle == "manual"):
                    continue
                try:
                    await self._reap(rt)
                except Exception:  # a bug here must not end the reaping for good
                    log.exception("%s: reaping owned objects failed", rt.key)

    async def _reap(self, rt: Any) -> None:
        res = await ops.run_op(rt.ctx, self.sup.node, rt.svc.name, "list_owned",
                               timeout_s=ops.OP_TIMEOUTS["list_owned"],
                               registry=self.sup.registry)
        if not res.ok or res.doc is None:
            log.debug("%s: list_owned: %s", rt.key, res.error)  # optional for a module
            return
        live, last = self.attempts()
        ids, problem = to_destroy(res.doc.get("objects", []), live, last)
        if problem is not None:
            log.warning("%s: %s", rt.key, problem)
        for oid in ids:
            if rt.st.state is lc.State.STOPPING:
                return  # its stop is under way; the next round asks again
            done = await ops.run_op(rt.ctx, self.sup.node, rt.svc.name, "destroy",
                                    timeout_s=ops.OP_TIMEOUTS["destroy"],
                                    registry=self.sup.registry, args=(oid, "--force"))
            if done.ok:
                log.info("%s: destroyed owned object %s (its attempt is over)", rt.key, oid)
            else:
                log.warning("%s: destroy %s --force failed: %s", rt.key, oid, done.error)
