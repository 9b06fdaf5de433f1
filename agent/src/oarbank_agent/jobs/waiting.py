"""Why a queued job is not admitted, in words a person can act on (pure, from service state).

Admission itself only sees token counts; a pool that counts 0 because its service is
withdrawn, held, or missing from its fingerprint looks the same there. This names the cause,
so that ``status`` and the job record say what the job waits for instead of waiting silently.
An admitted job waiting for its service to finish starting says so too, with the time spent
and the time allowed, or, once a start failed, the failure and when the next start is
(``admitted_wait_reason``, computed when read: it changes every second).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services.runtime import service_key
from oarbank_sdk import advice
from oarbank_sdk import manifest as mf

if TYPE_CHECKING:
    from oarbank_agent.modules.loaded import ModuleCtx
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["WAITING", "service_wait_reason", "admitted_wait_reason"]

WAITING = "waiting: "  # the prefix of every reason written here (cleared once admitted)


def service_wait_reason(sup: Supervisor, ctx: ModuleCtx, stage: mf.Stage) -> str | None:
    """The first service-side reason the stage's pools offer nothing now, or None."""
    for pool in (*stage.pools, *stage.needs_pools):
        svc = ctx.manifest.service_for_pool(pool)
        if svc is None:
            continue
        rt = sup.services.get(service_key(ctx.id, svc.name))
        if rt is None:
            continue
        if rt.st.state is lc.State.WITHDRAWN:
            return (f"{WAITING}service {rt.key} is withdrawn after {rt.st.failures} failures "
                    f"(last error: {rt.st.error or 'unknown'}); its pool {pool!r} counts 0 "
                    "until a healthy fingerprint after its backoff")
        if rt.held is not None:
            return f"{WAITING}service {rt.key} is held ({rt.held}); its pool {pool!r} counts 0"
        if rt.gpu_missing is not None:
            return f"{WAITING}service {rt.key}: {rt.gpu_missing}"
        if sup.capacities(rt.key).get(pool, 0) <= 0:
            # A healthy fingerprint that answers other pools than the manifest provides is
            # named as conform names it: no token of this pool will ever come.
            mismatch = (advice.pools_mismatch(rt.fp_pools, svc.pools)
                        if rt.health == "healthy" and pool not in rt.fp_pools else None)
            why = rt.fp_error or mismatch or (
                f"its fingerprint reports health {rt.health!r} and no tokens")
            return f"{WAITING}pool {pool!r} of service {rt.key} has no tokens on this node ({why})"
    return None


def admitted_wait_reason(sup: Supervisor, ctx: ModuleCtx, stage: mf.Stage,
                         now: float, wall_now: float) -> str | None:
    """For an admitted job: the first of its services still starting (the seconds since its
    start, from ``now``: monotonic, and its start_timeout_s; endpoint services) or backing off
    after a failure (its error and when the next start is, from ``wall_now``: unix time, as
    the lifecycle's ``retry_at``); None if none is."""
    for pool in stage.pools:
        svc = ctx.manifest.service_for_pool(pool)
        if svc is None:
            continue
        rt = sup.services.get(service_key(ctx.id, svc.name))
        if rt is None:
            continue
        st = rt.st
        if st.state is lc.State.BACKOFF and st.retry_at is not None:
            return WAITING + advice.restart_wait(rt.key, st.retry_at - wall_now, st.failures,
                                                 st.max_failures, st.error)
        if not svc.endpoint or st.state is not lc.State.STARTING or rt.start_began is None:
            continue
        hello = rt.channel is not None and rt.channel.hello.done()
        return WAITING + advice.starting_wait(rt.key, now - rt.start_began,
                                              svc.start_timeout_s, hello)
    return None
