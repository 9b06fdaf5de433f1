"""A claim as placement reads it: which of the stages a node offers the portal dispatches, and
one ``Candidate`` per stage with jobs queued (pure: the store supplies the queue and the
fleet's warmth, ``placement.decide`` the answer)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from .catalogue import Catalogue
from .placement import Candidate
from .protocol import Claim, ServiceOffer

__all__ = ["Warmth", "candidates", "offered_stages"]


class Warmth(NamedTuple):
    """A service on the other nodes, from their latest claims."""

    tokens: int = 0  # where it is ready or starting
    starting: int = 0  # of those, where it is starting
    job_s: float | None = None  # the mean of the job times they measured (None: nobody did)
    load_s: float | None = None  # the mean of the load times they measured (None: nobody did)


def offered_stages(claim: Claim, catalogue: Catalogue) -> list[tuple[str, str]]:
    """(module id, stage) the node offers and the portal dispatches: a module or stage the
    portal does not know gets no jobs (and is no error: nodes run other modules too)."""
    out: list[tuple[str, str]] = []
    for module, stages in claim.stages.items():
        info = catalogue.modules.get(module)
        if info is None:
            continue
        out.extend((module, s) for s in dict.fromkeys(stages) if s in info.stages)
    return out


def needs_fleet(claim: Claim, modules: Iterable[str]) -> bool:
    """Whether placement reads the other nodes for this claim (their warmth, the copies
    granted cold): only a service of ``modules`` here that is neither ready nor starting (a
    cold start is weighed against them) or whose load time this node does not know (the
    fleet's mean stands in, to judge a wait overdue). A node whose services are all warm
    and measured is answered from its own offer and the queue."""
    wanted = set(modules)
    return any(s.state not in ("ready", "starting") or s.load_s is None
               for s in claim.services if s.module in wanted)


def candidates(claim: Claim, catalogue: Catalogue,
               queue: dict[tuple[str, str], tuple[int, float]],
               warm: dict[tuple[str, str], Warmth],
               cold: dict[tuple[str, str], int] | None = None) -> list[Candidate]:
    """``queue``: (module, stage) -> (backlog, oldest job's wait in s), stages with jobs only;
    ``warm``: (module, service) -> the service on the other nodes; ``cold``: (module, stage)
    -> other nodes granted it cold lately whose claims do not show the copy starting yet:
    each counts as a copy starting with as many tokens as this node's."""
    offers: dict[tuple[str, str], ServiceOffer] = {(s.module, s.service): s
                                                   for s in claim.services}
    free: dict[tuple[str, str], int] = {}  # (module, pool) -> free tokens on this node
    for s in claim.services:
        for pool, (n, _total) in s.pools.items():
            free[(s.module, pool)] = n
    fresh: dict[tuple[str, str], int] = {}  # (module, service) -> cold copies not yet in warm
    for (module, stage), n in (cold or {}).items():
        info = catalogue.modules.get(module)
        service = info.stage_service(stage) if info is not None and stage in info.stages \
            else None
        if service is not None:  # a node granted two of its stages is one copy
            fresh[(module, service)] = max(fresh.get((module, service), 0), n)
    out = []
    for (module, stage), (backlog, wait) in queue.items():
        info = catalogue.modules[module]
        need = info.stages[stage]
        if not need:
            out.append(Candidate(module, stage, "none", claim.max_grants, backlog, wait))
            continue
        service = info.stage_service(stage)
        offer = offers.get((module, service)) if service is not None else None
        if offer is None:
            continue  # the node does not report the service its pool needs: it cannot run it
        slots = min(free.get((module, pool), 0) // max(1, n) for pool, n in need.items())
        w = warm.get((module, offer.service), Warmth())
        extra = fresh.get((module, offer.service), 0) * sum(t for _f, t in offer.pools.values())
        out.append(Candidate(module, stage, offer.state, slots, backlog, wait,
                             warm_tokens=w.tokens + extra, starting_tokens=w.starting + extra,
                             load_s=offer.load_s, job_s=offer.job_s, fleet_job_s=w.job_s,
                             fleet_load_s=w.load_s,
                             mem_gb=offer.mem_gb, service=offer.service))
    return out
