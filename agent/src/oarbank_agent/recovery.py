"""What a restarted agent does with what its predecessor left (contract section 2, "after an
agent restart"), on the same state dir.

Rules:

- Every recorded process group (``<state>/procs``) is ended: ops, runners (their jobs are
  requeued) and endpoint services, which are **never adopted** (their channel died with the old
  agent: nothing could reach them), unless a keeper kept their channel (``--keep-services``).
  The one exception: the group of a loaded, non-endpoint, non-manual service is kept until
  its ``fingerprint`` has been asked.
- A non-endpoint service whose ``fingerprint.running`` is true is **adopted**: it is ready as
  it is (never started twice) and its group, if recorded, is watched from now on. If it is not
  running, its kept group is ended too.
- An endpoint service whose ``fingerprint`` still says running after its group was ended (its
  daemon escaped the group, or the record was lost in the crash) gets its ``stop`` op, so that
  the one started anew when a job needs it is the only one.
- With ``--keep-services`` (``keep/``): the group of an endpoint service whose channel came
  back from the keeper is spared here; ``keep/adopt.py`` then adopts it or stops it.
- Where containment holds groups firmly, what left a recorded group is ended with it, and so
  is whatever the predecessor left that no record names (``Groups.sweep``: a group made just
  before a crash has no record yet).
- A job whose record shows an attempt that began and never finished (the agent died or stopped
  under it) is first looked at: if its runner's files prove it finished (``jobs/collect.py``:
  a complete, valid ``result.json``, or a ``failure.json`` naming its fault) its outcome is
  *collected*, recorded as if the agent had seen the runner exit (the history entry says
  ``collected``), and nothing runs again. Otherwise the attempt is *released*, not charged,
  not a failure, and runs again. Attempt numbers are never reused (the next attempt id follows
  the interrupted one). The runners are dead by then: the agent's watcher killed them when it
  died (``platform/posix/tether.py``; Windows: the job objects), or ``end_leftovers`` did.

``end_leftovers`` runs before anything is started; ``adopt_running`` after the first
fingerprints; ``collect_interrupted``, then ``uncharge_interrupted``, on each job record
before it is requeued; ``after_restart`` counts both for ``status``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from oarbank_agent import platform, procs
from oarbank_agent.jobs import collect
from oarbank_agent.jobs import machine as jobs
from oarbank_agent.services import ops

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from oarbank_agent.jobs.store import JobRecord
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["end_leftovers", "adopt_running", "uncharge_interrupted", "collect_interrupted",
           "after_restart", "INTERRUPTED", "COLLECTED"]

log = logging.getLogger("oarbank_agent.recovery")

INTERRUPTED = "the agent stopped during this attempt; it was requeued without charge"
# A history entry's ``collected``: the outcome was read after a restart, the runner not re-run.
COLLECTED = "after an agent restart: the runner had finished; its outcome was collected"


def _service_of(rec: procs.GroupRecord) -> str | None:
    """The service key of a service group record (label ``<module>/<service> start``)."""
    if rec.kind != "service":
        return None
    return rec.label.rsplit(" ", 1)[0]


async def end_leftovers(registry: procs.ProcessRegistry, sup: Supervisor,
                        grace_s: float = 2.0, spare: frozenset[str] = frozenset(),
                        ) -> dict[str, procs.GroupRecord]:
    """End the predecessor's groups; return the kept ones (service key -> record) of
    non-endpoint services that may be adopted once fingerprinted. ``spare``: service keys
    whose channel the keeper gave back (their groups are decided on by ``keep/adopt.py``)."""
    kept: dict[str, procs.GroupRecord] = {}
    spared: list[procs.GroupRecord] = []
    for rec in registry.records():
        if not rec.group.alive():
            registry.remove(rec.group)  # gone already (or another boot: a reused number)
            continue
        key = _service_of(rec)
        if key is not None and key in spare:
            spared.append(rec)
            continue
        rt = sup.services.get(key) if key else None
        if (rt is not None and key not in kept and not rt.svc.endpoint
                and rt.svc.lifecycle != "manual"):
            kept[key] = rec  # type: ignore[index]
            continue
        what = ("endpoint service, never adopted" if rt is not None and rt.svc.endpoint
                else rec.kind)
        log.warning("ended a process group left by a previous agent: %s (%s, group %s)",
                    rec.label, what, rec.group)
        await rec.group.end(grace_s)
        registry.remove(rec.group)
    # What was left without a (live) record, e.g. made just before the crash: ended too.
    await platform.current().groups.sweep([r.group for r in [*kept.values(), *spared]],
                                          grace_s)
    return kept


async def adopt_running(registry: procs.ProcessRegistry, sup: Supervisor,
                        kept: dict[str, procs.GroupRecord], grace_s: float = 2.0,
                        readopted: frozenset[str] = frozenset()) -> None:
    """After the first fingerprints: adopt running non-endpoint services, end the rest.
    ``readopted``: endpoint services taken back with their kept channel (``keep/adopt.py``)."""
    for key, rt in sup.services.items():
        rec = kept.pop(key, None)
        if rt.svc.lifecycle == "manual" or key in readopted:
            continue
        if rt.svc.endpoint:
            if rt.fp_running:
                log.warning("%s: an endpoint service still runs after the previous agent's "
                            "groups were ended: running its stop op (it is never adopted)", key)
                await ops.run_op(rt.ctx, sup.node, rt.svc.name, "stop",
                                 timeout_s=rt.svc.stop_timeout_s, registry=registry)
            continue
        if rt.fp_running:
            alive = rec is not None and rec.group.alive()
            if rec is not None and alive:
                platform.current().groups.adopt(rec.group)  # ended with it when it stops
            log.warning("%s: adopted (fingerprint says running; %s)", key,
                        f"process group {rec.group}" if alive and rec else "no recorded group")
            sup.adopt(rt, rec.group if alive and rec else None)
            if rec is not None and not alive:
                registry.remove(rec.group)
        elif rec is not None:
            log.warning("ended a process group left by a previous agent: %s (service not "
                        "running per its fingerprint, group %s)", rec.label, rec.group)
            await rec.group.end(grace_s)
            registry.remove(rec.group)
    for rec in kept.values():  # services no longer loaded: nothing may use them
        await rec.group.end(grace_s)
        registry.remove(rec.group)


def _interrupted(rec: JobRecord) -> bool:
    """Finished and released attempts each leave a history entry; an attempt counted in
    ``attempts`` with no entry of its own was interrupted by the agent going away."""
    finished = sum(1 for h in rec.history if h.get("outcome") != "released")
    return rec.attempts > finished


def collect_interrupted(rec: JobRecord, job_dir: Path, max_inline_kb: float,
                        max_attempts: int) -> collect.Verdict | None:
    """Record the outcome of an interrupted attempt whose runner finished (``collect.py``
    decides from its workdir). The verdict when there was an interrupted attempt (collected
    or not), None when there was none. A collected job is final, or ``admitted`` after a
    transient failure with attempts left (the caller requeues it)."""
    if not _interrupted(rec):
        return None
    number = rec.attempts + rec.released
    workdir = job_dir / f"a{number}"
    verdict = collect.decide(
        collect.seen(workdir / "result.json", int(max_inline_kb * 1024)),
        collect.seen(workdir / "failure.json", collect.FAILURE_MAX_BYTES), max_inline_kb)
    if not verdict.collect:
        return verdict
    assert verdict.state is not None
    # queued|admitted|running -> running: the attempt the record shows, as it was
    rec.state = jobs.apply(rec.state, jobs.Event.COLLECT).value
    now = time.time()
    rec.history.append({"attempt": rec.attempts, "attempt_id": f"{rec.job_id}.{number}",
                        "wire_attempt": rec.wire_attempt,
                        "started_at": rec.started_at or now, "finished_at": now,
                        "outcome": verdict.state, "exit_code": None, "reason": verdict.reason,
                        "fault": verdict.fault, "collected": COLLECTED})
    event = jobs.after_attempt(verdict.state, verdict.fault, rec.attempts, max_attempts, [], 0)
    # running -> succeeded | failed, or -> admitted (a transient failure, attempts left)
    rec.state = jobs.apply(rec.state, event).value
    rec.exit_code, rec.reason = None, verdict.reason
    if event is jobs.Event.RETRY:
        return verdict
    if verdict.state == "retry":
        rec.reason = f"{verdict.reason} (gave up after {rec.attempts} attempts)"
    rec.result = verdict.result
    rec.finished_at = now
    return verdict


def after_restart(records: Iterable[JobRecord]) -> dict[str, int]:
    """``status``' counts over the jobs the agent keeps: ``collected``, jobs with an attempt
    whose outcome was collected after a restart; ``rerun``, jobs with an attempt the agent
    stopped or died under, run again."""
    collected = rerun = 0
    for rec in records:
        collected += any(h.get("collected") for h in rec.history)
        rerun += any(h.get("reason") == INTERRUPTED for h in rec.history)
    return {"collected": collected, "rerun": rerun}


def uncharge_interrupted(rec: JobRecord) -> bool:
    """Give back an attempt that began and never finished. True if there was one."""
    if not _interrupted(rec):
        return False
    number = rec.attempts + rec.released
    rec.attempts -= 1
    rec.released += 1
    now = time.time()
    rec.history.append({"attempt": None, "attempt_id": f"{rec.job_id}.{number}",
                        "started_at": rec.started_at or now, "finished_at": now,
                        "outcome": "released", "exit_code": None, "reason": INTERRUPTED,
                        "fault": None})
    return True
