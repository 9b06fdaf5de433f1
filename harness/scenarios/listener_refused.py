"""listener-refused: a module whose service tries to listen fails the conformance kit, and
under the agent its listens are refused: it never listens, fails and is withdrawn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.scenario import Ctx, module_path, scenario

LISTENER = "dev.oarbank.e2e.listener"


def _sdk_command() -> list[str]:
    here = Path(sys.executable).parent / "oarbank-sdk"
    return [str(here)] if here.exists() else [sys.executable, "-m", "oarbank_sdk"]


@scenario("listener-refused", "a service that tries to listen fails conform and cannot "
          "listen under the agent")
def listener_refused(ctx: Ctx) -> None:
    # 1. The conformance kit, on the host, as a module author runs it.
    r = subprocess.run([*_sdk_command(), "conform", str(module_path("listener"))],
                       capture_output=True, text=True, timeout=120, cwd=ctx.folder,
                       stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    (ctx.folder / "conform.txt").write_text(out)
    fails = [ln for ln in out.splitlines() if "FAIL" in ln]
    ctx.check(r.returncode == 1 and fails,
              f"oarbank-sdk conform should fail the listener (exit 1, FAIL lines): "
              f"exit {r.returncode}: {out[-800:]}")
    ctx.note(f"conform exit {r.returncode}; {fails[0].strip()[:200]}")

    # 2. Under the agent: wait until it is withdrawn, or until a listen was granted (then
    # there is no point waiting: the sandbox let it listen).
    node = ctx.node("listen-a", ["listener"])

    def tries() -> list[dict]:
        return [json.loads(x) for x in node.read_lines("listen.attempts")]

    def settled() -> dict | None:
        r = node.service_row(LISTENER, "web")
        if any(t.get("ok") for t in tries()) or (r and r["withdrawn"]):
            return r
        return None

    row = ctx.wait_for("the listener withdrawn (or a listen granted)", settled, 60)
    seen = tries()
    ctx.check(seen, "the service never tried to listen (no listen.attempts)")
    granted = [t for t in seen if t.get("ok")]
    ctx.check(not granted, f"a listen was granted under the agent: {granted}")
    ctx.note(f"{len(seen)} listen tries, all refused: "
             f"{sorted({t['kind'] + ': ' + str(t['error']) for t in seen})}")
    ctx.check(row["withdrawn"] and not row["running"] and not row["ready"],
              f"the service should be withdrawn, not running: {row}")
    ctx.note(f"row withdrawn: error={row['error']!r}")
