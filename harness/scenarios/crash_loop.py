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

    # It stops trying: exactly max_failures starts, and no more after the backoff would
    # have allowed another (backoff_max_s = 1 s).
    attempts = node.read_lines("start.attempts")
    time.sleep(2.5)
    later = node.read_lines("start.attempts")
    ctx.check(len(attempts) == MAX_FAILURES and later == attempts,
              f"start attempts: {len(attempts)} at withdrawal, {len(later)} 2.5 s later "
              f"(want {MAX_FAILURES} and no more)")
    gaps = [float(b) - float(a) for a, b in zip(attempts, attempts[1:], strict=False)]
    ctx.check(all(g >= 0.25 for g in gaps), f"restarts did not back off: gaps {gaps}")
    ctx.note(f"{len(attempts)} start attempts, gaps {[round(g, 2) for g in gaps]} s, "
             "none after withdrawal")
    procs = [p for p in node.processes() if "crashy.py" in p.cmdline]
    ctx.check(not procs, f"processes of the withdrawn service remain: {[str(p) for p in procs]}")

    pr = wait_portal(ctx, CRASHY, node, "model", "stopped, withdrawn, with the error",
                     lambda r: r.get("state") == "stopped"
                     and r.get("stopped_reason") == "withdrawn"
                     and r.get("error") == row_error)
    ctx.note(f"portal row: state={pr['state']} stopped_reason={pr['stopped_reason']} "
             f"error={pr['error']!r}")
