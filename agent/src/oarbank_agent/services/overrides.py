"""Per-service timing overrides from the config file (``[services."<module>/<service>"]``).

An operator may change, per node, a service's ``idle_timeout_s``, ``start_timeout_s``,
``stop_timeout_s`` and its restart backoff (``backoff_initial_s``, ``backoff_max_s``,
``max_failures``) without editing the module's bundle. The manifest's bounds hold:

- every value is positive, as the manifest's checker requires (``max_failures`` an integer);
- ``start_timeout_s`` and ``stop_timeout_s`` may be raised, never lowered below the
  manifest's: the author measured what a start needs and what a graceful stop needs, and a
  shorter bound would fail a healthy start or kill a service mid-stop;
- ``backoff_max_s`` is not less than ``backoff_initial_s`` (after the override).

``check`` is pure: the new ``Service`` (and the message of each problem); ``apply`` puts the
new timings into a running supervisor, where the idle timer takes them at once (reload).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from oarbank_sdk import manifest as mf

if TYPE_CHECKING:
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["KEYS", "OverrideError", "check", "apply"]

KEYS = ("idle_timeout_s", "start_timeout_s", "stop_timeout_s", "backoff_initial_s",
        "backoff_max_s", "max_failures")
_NOT_BELOW_MANIFEST = ("start_timeout_s", "stop_timeout_s")
TIMINGS = ("idle_timeout_s", "start_timeout_s", "stop_timeout_s")  # the service's own fields


class OverrideError(ValueError):
    pass


def check(key: str, svc: mf.Service, table: dict[str, Any]) -> mf.Service:
    """The service with ``table``'s timings. Raises OverrideError naming every problem."""
    problems = []
    for k, v in table.items():
        if k not in KEYS:
            problems.append(f"{k}: not a timing that may be overridden ({', '.join(KEYS)})")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            problems.append(f"{k} = {v!r}: must be a number > 0")
        elif k == "max_failures" and not isinstance(v, int):
            problems.append(f"{k} = {v!r}: must be an integer")
        elif k in _NOT_BELOW_MANIFEST and v < getattr(svc, k):
            problems.append(f"{k} = {v:g}: below the manifest's {getattr(svc, k):g} (it may "
                            "be raised, never lowered)")
    if problems:
        raise OverrideError(f'services."{key}": ' + "; ".join(problems))
    r = svc.restart
    restart = dataclasses.replace(
        r, backoff_initial_s=float(table.get("backoff_initial_s", r.backoff_initial_s)),
        backoff_max_s=float(table.get("backoff_max_s", r.backoff_max_s)),
        max_failures=int(table.get("max_failures", r.max_failures)))
    if restart.backoff_max_s < restart.backoff_initial_s:
        raise OverrideError(f'services."{key}": backoff_max_s {restart.backoff_max_s:g} is '
                            f"less than backoff_initial_s {restart.backoff_initial_s:g}")
    timings: dict[str, Any] = {k: float(table[k]) for k in TIMINGS if k in table}
    return dataclasses.replace(svc, restart=restart, **timings)


def apply(supervisor: Supervisor, overrides: dict[str, dict[str, Any]],
          manifest_services: dict[str, mf.Service], *, live: bool) -> list[str]:
    """Set every service's timings: the manifest's, with ``overrides`` on top (a service no
    longer overridden goes back to its manifest). ``manifest_services`` holds each service as
    its manifest says (the bounds); ``live``: the agent runs (a reload). Returns what
    changed, one line each. Raises OverrideError (nothing applied) for an unknown service or a
    bad value."""
    unknown = [k for k in overrides if k not in supervisor.services]
    if unknown:
        known = ", ".join(sorted(supervisor.services)) or "none"
        raise OverrideError(f"services: {', '.join(repr(k) for k in unknown)} is not a "
                            f"loaded service (loaded: {known})")
    new = {k: check(k, manifest_services[k], overrides.get(k, {})) for k in supervisor.services}
    changed = []
    for key, svc in new.items():
        rt = supervisor.services[key]
        if svc == rt.svc:
            continue
        diff = [f"{k} {_get(rt.svc, k):g} -> {_get(svc, k):g}" for k in KEYS
                if _get(rt.svc, k) != _get(svc, k)]
        changed.append(f"{key}: {', '.join(diff)}")
        supervisor.set_timings(key, svc, live=live)
    return changed


def _get(svc: mf.Service, k: str) -> float:
    return float(getattr(svc.restart, k) if k.startswith(("backoff", "max_")) else
                 getattr(svc, k))
