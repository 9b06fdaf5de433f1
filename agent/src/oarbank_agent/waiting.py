"""Why a queued job is not admitted, in words a person can act on (pure, from service state).

Admission itself only sees token counts; a pool that counts 0 because its service is
withdrawn, held, or missing from its fingerprint looks the same there. This names the cause,
so that ``status`` and the job record say what the job waits for instead of waiting silently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oarbank_sdk import manifest as mf

from . import lifecycle as lc
from .supervisor import service_key

if TYPE_CHECKING:
    from .modules import ModuleCtx
    from .supervisor import Supervisor

__all__ = ["WAITING", "service_wait_reason"]

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
            why = rt.fp_error or f"its fingerprint reports health {rt.health!r} and no tokens"
            return f"{WAITING}pool {pool!r} of service {rt.key} has no tokens on this node ({why})"
    return None
