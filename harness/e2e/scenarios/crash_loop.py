"""crash-loop: a service whose start keeps failing backs off with growing delays, is withdrawn
after max_failures with the module's own reason, and shows why (status row and the portal's
services query)."""

from __future__ import annotations

import sys
import time

if sys.version_info >= (3, 11):
    import tomllib
else:  # the SDK depends on tomli there
    import tomli as tomllib

from harness.e2e.scenario import Ctx, module_path, scenario
from harness.e2e.scenarios.common import wait_portal, wait_row

CRASHY = "dev.oarbank.e2e.crashy"
REASON = "model weights missing"  # what crashy.py prints on stderr when its start fails
SLACK = 0.75  # a gap may come a little early against the policy's delay (timers, noise)


def _policy() -> dict[str, float]:
    """The restart policy from crashy's own manifest (the scenario follows the module)."""
    doc = tomllib.loads((module_path("crashy") / "oarbank-module.toml").read_text())
    [svc] = doc["services"]
    return svc["restart"]


def expected_delays(initial_s: float, max_s: float, max_failures: int) -> list[float]:
    """The wait before each restart under the contract's policy: initial * 2**(n-1), capped."""
    return [min(initial_s * 2 ** n, max_s) for n in range(max_failures - 1)]


@scenario("crash-loop", "a service that keeps failing backs off (growing delays), is withdrawn "
          "after max_failures with the module's reason, and shows why", needs_portal=True)
def crash_loop(ctx: Ctx) -> None:
    policy = _policy()
    max_failures = int(policy["max_failures"])
    delays = expected_delays(policy["backoff_initial_s"], policy["backoff_max_s"], max_failures)
    node = ctx.node("crash-a", ["crashy"])
    r = wait_row(ctx, node, CRASHY, "model", "withdrawn", lambda r: r["withdrawn"], 60)
    ctx.note(f"row withdrawn: running={r['running']} error={r['error']!r}")
    row_error = r["error"]
    ctx.check(not r["running"] and not r["ready"], f"a withdrawn service runs: {r}")
    ctx.check(r["error"] and "start" in str(r["error"]),
              f"the row's error should say what failed (the start op): {r['error']!r}")
    ctx.check(REASON in str(r["error"]),
              f"the withdrawn reason is not the module's ({REASON!r} on its stderr): "
              f"{r['error']!r}")

    # The first max_failures starts are spaced by the policy's delays, each one longer than the
    # last (a start's own run time only adds to a gap, so the delays are lower bounds).
    attempts = [float(x) for x in node.read_lines("start.attempts")]
    ctx.check(len(attempts) >= max_failures,
              f"withdrawn after {len(attempts)} start(s), want {max_failures}")
    first = attempts[:max_failures]
    gaps = [b - a for a, b in zip(first, first[1:], strict=False)]
    ctx.check(all(g >= SLACK * d for g, d in zip(gaps, delays, strict=True)),
              f"restart gaps {[round(g, 2) for g in gaps]} s are shorter than the policy's "
              f"delays {delays} s")
    # Each gap longer than the last by at least half of what the policy adds (a start's own run
    # time is in every gap and cancels out here, but for its noise on a loaded machine).
    grew = [b - a for a, b in zip(gaps, gaps[1:], strict=False)]
    want = [b - a for a, b in zip(delays, delays[1:], strict=False)]
    ctx.check(all(g >= 0.5 * w for g, w in zip(grew, want, strict=True)),
              f"restart gaps {[round(g, 2) for g in gaps]} s did not grow as the policy's "
              f"delays {delays} s do")
    ctx.note(f"first {max_failures} starts {[round(g, 2) for g in gaps]} s apart "
             f"(policy: at least {delays} s)")

    # Withdrawn: a healthy fingerprint lets it try again (contract section 2), at most once
    # per backoff_max_s, never in a tight loop.
    watch_s = policy["backoff_max_s"]
    time.sleep(watch_s)
    later = [float(x) for x in node.read_lines("start.attempts")][len(attempts):]
    ctx.check(len(later) <= 1,
              f"{len(later)} starts in {watch_s:g} s after withdrawal: a crash loop "
              f"(backoff_max_s {watch_s:g})")
    ctx.note(f"{len(later)} start(s) in the {watch_s:g} s after withdrawal")

    pr = wait_portal(ctx, CRASHY, node, "model", "stopped, withdrawn, with the error",
                     lambda r: r.get("state") == "stopped"
                     and r.get("stopped_reason") == "withdrawn"
                     and r.get("error") == row_error)
    ctx.note(f"portal row: state={pr['state']} stopped_reason={pr['stopped_reason']} "
             f"error={pr['error']!r}")
