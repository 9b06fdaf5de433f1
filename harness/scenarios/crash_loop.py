"""crash-loop: a service whose start keeps failing backs off, is withdrawn after
max_failures, and shows why (status row and the portal's services query)."""

from __future__ import annotations

import time

from harness.scenario import Ctx, scenario
from harness.scenarios.common import wait_portal, wait_row

CRASHY = "dev.oarbank.e2e.crashy"
MAX_FAILURES = 3  # harness/modules/crashy
REASON = "model weights missing"  # what crashy.py prints when its start fails


@scenario("crash-loop", "a service that keeps failing is withdrawn after max_failures and "
          "shows why", needs_portal=True)
def crash_loop(ctx: Ctx) -> None:
    node = ctx.node("crash-a", ["crashy"])
    r = wait_row(ctx, node, CRASHY, "model", "withdrawn", lambda r: r["withdrawn"], 60)
    ctx.note(f"row withdrawn: running={r['running']} error={r['error']!r}")
    row_error = r["error"]
    ctx.check(not r["running"] and not r["ready"], f"a withdrawn service runs: {r}")
    ctx.check(r["error"] and "start" in str(r["error"]),
              f"the row's error should say what failed (the start op): {r['error']!r}")
    ctx.note("the error carries the module's own reason" if REASON in str(r["error"])
             else f"the error does not carry the module's stderr ({REASON!r})")

    # It backs off: the first max_failures starts are spaced by the growing backoff, and
    # afterwards (a healthy fingerprint lets it try again after the backoff, contract
    # section 2) it is tried at most once per backoff_max_s, never in a tight loop.
    attempts = [float(x) for x in node.read_lines("start.attempts")]
    ctx.check(len(attempts) >= MAX_FAILURES,
              f"withdrawn after {len(attempts)} start(s), want {MAX_FAILURES}")
    first = attempts[:MAX_FAILURES]
    gaps = [b - a for a, b in zip(first, first[1:], strict=False)]
    ctx.check(all(g >= 0.25 for g in gaps), f"restarts did not back off: gaps {gaps}")
    time.sleep(3.0)
    later = [float(x) for x in node.read_lines("start.attempts")][len(attempts):]
    ctx.check(len(later) <= 3 + 1,
              f"{len(later)} starts in 3 s after withdrawal: a crash loop (backoff_max_s 1)")
    ctx.note(f"first {MAX_FAILURES} starts {[round(g, 2) for g in gaps]} s apart; "
             f"{len(later)} start(s) in the 3 s after withdrawal")

    pr = wait_portal(ctx, CRASHY, node, "model", "stopped, withdrawn, with the error",
                     lambda r: r.get("state") == "stopped"
                     and r.get("stopped_reason") == "withdrawn"
                     and r.get("error") == row_error)
    ctx.note(f"portal row: state={pr['state']} stopped_reason={pr['stopped_reason']} "
             f"error={pr['error']!r}")
