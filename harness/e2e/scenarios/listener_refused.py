"""listener-refused: a service that tries to listen, hides the refusal and serves on, fails the
conformance kit on the attempt alone (its hello, ready and requests pass); under the agent its
listens are refused by the kernel (EPERM), it never listens, it still serves, and the agent
counts the attempts (status `sandbox_refusals`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from harness.e2e.scenario import Ctx, module_path, scenario

LISTENER = "dev.oarbank.e2e.listener"


def _sdk_command() -> list[str]:
    here = Path(sys.executable).parent / "oarbank-sdk"
    return [str(here)] if here.exists() else [sys.executable, "-m", "oarbank_sdk"]


@scenario("listener-refused", "a service that tries to listen fails conform and cannot "
          "listen under the agent", walls=("seccomp_socket", "seccomp_listen"))
def listener_refused(ctx: Ctx) -> None:
    # 1. The conformance kit, on the host, as a module author runs it. The module passes its
    # hello and ready: the only thing that can fail it is the kit seeing the attempt.
    r = subprocess.run([*_sdk_command(), "conform", str(module_path("listener"))],
                       capture_output=True, text=True, timeout=120, cwd=ctx.folder,
                       stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    (ctx.folder / "conform.txt").write_text(out)
    fails = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
    ctx.check(r.returncode == 1 and fails,
              f"oarbank-sdk conform should fail the listener (exit 1, FAIL lines): "
              f"exit {r.returncode}: {out[-800:]}")
    hello = re.search(r"^ok   service web: hello: pid (\d+)", out, re.M)
    ctx.check(hello, f"the listener should pass its hello under conform: {out[-800:]}")
    pid = hello.group(1) if hello else "?"
    other = [ln for ln in fails if not ln.startswith("FAIL service web: no network attempts")]
    ctx.check(not other, f"conform should fail the listener only for its attempts: {other}")
    ctx.check(any(f"by pid {pid} (" in ln and "socket(AF_INET)" in ln for ln in fails),
              f"conform's FAIL should name socket(AF_INET) and the daemon (pid {pid}): {fails}")
    ctx.note(f"conform exit {r.returncode}; {fails[0].strip()[:240]}")

    # 2. Under the agent: wait until the daemon has tried both listens and is ready, or until
    # a listen was granted (then there is no point waiting: the sandbox let it listen).
    node = ctx.node("listen-a", ["listener"])

    def tries() -> list[dict]:
        return [json.loads(x) for x in node.read_lines("listen.attempts")]

    def settled() -> dict | None:
        r = node.service_row(LISTENER, "web")
        seen = tries()
        if any(t.get("ok") for t in seen) or (len(seen) >= 2 and r and r["ready"]):
            return r
        return None

    row = ctx.wait_for("the listener's two listen tries and its ready row (or a listen "
                       "granted)", settled, 60)
    seen = tries()
    granted = [t for t in seen if t.get("ok")]
    ctx.check(not granted, f"a listen was granted under the agent: {granted}; the agent's "
              f"sandbox: {node.status().get('sandbox')}")
    not_eperm = [t for t in seen if "Errno 1]" not in str(t.get("error"))]
    ctx.check(not not_eperm, f"each listen should be refused with EPERM: {not_eperm}")
    ctx.note(f"{len(seen)} listen tries, all refused: "
             f"{sorted({t['kind'] + ': ' + str(t['error']) for t in seen})}")
    ctx.check(row["ready"] and row["running"] and not row["withdrawn"],
              f"the service should serve on (ready), its listens refused: {row}")
    ctx.note(f"row ready, error={row['error']!r}")
    # The agent counted the attempts itself (seccomp user notification), not from the service,
    # where this node can count them (its status says so).
    st = node.status()
    counted = (st.get("sandbox_refusals") or {}).get(f"{LISTENER}/web")
    if st.get("sandbox_refusals_counted"):
        ctx.check(counted and counted["count"] >= 2 and "socket(AF_INET)" in counted["first"],
                  f"the agent's status should count the refused attempts (sandbox_refusals): "
                  f"{counted}")
        ctx.note(f"agent sandbox_refusals: {counted['count']}, first: {counted['first'][:120]}")
    else:
        ctx.note("this node's agent cannot count refused attempts (sandbox_refusals_counted "
                 "false): refused, not counted")
