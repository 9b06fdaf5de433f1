"""Drain: how the agent stops when asked (a stop request, ``oarbank-agent drain``).

1. stop admitting: the stop event is set, so ``submit`` is refused (``shutting_down``) and
   nothing queued is admitted;
2. the running attempts get up to ``--drain-s`` to finish (their results are kept as usual);
   a runner that accepts a stop (``cancellable``) is asked at once to stop at its next safe
   point (a checkpoint first, if it writes them): released when it does, not charged;
3. what is still running then is released: its attempt ended and not charged, the job left
   queued on disk for the next agent on this state dir (a portal job is handed back to the
   portal once the agent has stopped: ``fleet/leases.py`` ``hand_back``);
4. services stop in contract order and the agent exits (``Agent.shutdown``).

Each step is logged at INFO with its figures: a drain is the node working, not a problem.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oarbank_agent.jobs.run import JobRuns
    from oarbank_agent.jobs.store import JobRecord

__all__ = ["DEFAULT_DRAIN_S", "wait_running"]

DEFAULT_DRAIN_S = 30.0

log = logging.getLogger("oarbank_agent.operate.drain")


async def wait_running(runs: JobRuns, records: dict[str, JobRecord], drain_s: float,
                       why: str, hurry: asyncio.Event | None = None) -> list[str]:
    """Steps 1-2 (the stop event is already set): wait up to ``drain_s`` for the runs in
    flight, or until ``hurry`` is set (a second stop request: the operator will not wait).
    Returns the job ids still running then (released next)."""
    t0 = time.monotonic()
    tasks = dict(runs.tasks)
    running = [j for j in tasks if records[j].state == "running"]
    log.info("drain (%s): admitting nothing more; %d attempt(s) running, %d admitted; "
             "waiting up to %gs for them to finish", why, len(running),
             len(tasks) - len(running), drain_s)
    asked = runs.ask_to_stop(running, f"drain ({why})")
    if asked:
        log.info("drain: %d runner(s) asked to stop at a safe point: %s", len(asked),
                 ", ".join(asked))
    if tasks and drain_s > 0:
        waits: set[asyncio.Future[Any]] = {asyncio.gather(*tasks.values(),
                                                          return_exceptions=True)}
        hurried = None
        if hurry is not None:
            hurried = asyncio.ensure_future(hurry.wait())
            waits.add(hurried)
        try:
            await asyncio.wait(waits, timeout=drain_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if hurried is not None:
                hurried.cancel()
        if hurry is not None and hurry.is_set():
            log.info("drain: asked again to stop: not waiting any longer")
    left = [j for j, t in runs.tasks.items() if not t.done()]
    done = len(tasks) - len([j for j in tasks if j in left])
    log.info("drain: %d job run(s) ended in %.1fs; %d still in flight: released (requeued, "
             "not charged)", done, time.monotonic() - t0, len(left))
    return left
