"""``oarbank-agent submit | status | drain | reload``: one request each to a running agent.

``submit`` queues a job (``--wait``: prints its final record; exit 0 only if it succeeded);
``status`` prints the node's services and a page of its jobs (``--json``: the agent's answer);
``drain`` and ``reload`` ask what a stop and a reload request ask (``platform.api.Requests``:
signals on POSIX). Exit codes as every control command
(cli.py's banner): 1 not running or failed, 2 bad input, 3 not permitted.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from oarbank_agent import faults
from oarbank_agent.operate import control
from oarbank_agent.operate.cli_common import EXIT_NOT_PERMITTED, EXIT_NOT_RUNNING
from oarbank_agent.operate.cli_common import err as _err
from oarbank_agent.operate.cli_common import not_permitted as _not_permitted
from oarbank_agent.operate.cli_common import request as _request

__all__ = ["cmd_control", "cmd_status", "cmd_submit"]


def cmd_control(args: argparse.Namespace) -> int:
    """``drain`` and ``reload``: one request to the running agent."""
    reply = _request(args.state_dir, {"op": args.command})
    if isinstance(reply, int):
        return reply
    if not reply.get("ok"):
        _err(reply.get("error", f"{args.command} failed"))
        return 2 if reply.get("code") == "bad_request" else 1
    if args.command == "drain":
        print(f"draining: running attempts get up to {reply.get('drain_s', 0):g}s, then the "
              "agent stops")
    else:
        for line in reply.get("changes", []):
            print(line)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        _err(f"--payload is not valid JSON: {exc}")
        return 2
    if not isinstance(payload, dict):
        _err(f"--payload must be a JSON object, got {type(payload).__name__}")
        return 2
    if args.timeout is not None and args.timeout < 0:
        _err("--timeout must be >= 0")
        return 2
    try:
        with control.Client(args.state_dir, timeout=30.0) as c:
            reply = c.call({"op": "submit", "module": args.module, "stage": args.stage,
                            "payload": payload})
            if not reply.get("ok"):
                _err(reply.get("error", "submit refused"))
                return 2 if reply.get("code") in ("unknown_module", "unknown_stage",
                                                  "bad_request", "gpu_api_missing",
                                                  "exceeds_memory_budget",
                                                  "unsupported_platform",
                                                  "runner_undetected",
                                                  "module_disabled", "module_removed") else 1
            job_id = reply["job_id"]
            if not args.wait:
                print(job_id)
                return 0
            req: dict[str, Any] = {"op": "wait", "job_id": job_id}
            if args.timeout is not None:
                req["timeout"] = args.timeout
            # The agent answers when the job ends or --timeout passes: wait that long (and a
            # little more for the answer itself), not the 30 s a control request gets.
            reply = c.call(req, timeout=None if args.timeout is None else args.timeout + 30.0)
    except control.AgentNotRunning as exc:
        _err(str(exc))
        return EXIT_NOT_RUNNING
    except PermissionError:
        _err(_not_permitted(args.state_dir))
        return EXIT_NOT_PERMITTED
    except (OSError, ValueError) as exc:
        _err(f"lost the agent: {exc}")
        return 1
    if not reply.get("ok"):
        if reply.get("code") == "timeout":
            job = reply.get("job", {})
            why = f"; {job['reason']}" if job.get("reason") else ""  # e.g. a starting service
            _err(f"timed out after {args.timeout:g}s waiting for job {job_id} "
                 f"(state: {job.get('state')}{why}); it keeps running")
        else:
            _err(reply.get("error", "wait failed"))
        return 1
    job = reply["job"]
    print(json.dumps(job))
    return 0 if job.get("state") == "succeeded" else 1


def cmd_status(args: argparse.Namespace) -> int:
    if args.page < 1 or args.per_page < 0:
        _err("--page must be >= 1 and --per-page >= 0")
        return 2
    req: dict[str, Any] = {"op": "status"}
    if args.per_page:
        req.update(jobs_limit=args.per_page, jobs_page=args.page)
    reply = _request(args.state_dir, req)
    if isinstance(reply, int):
        return reply
    if not reply.get("ok"):
        _err(reply.get("error", "status failed"))
        return 1
    st = reply["status"]
    if args.json:
        print(json.dumps(st, indent=1))
        return 0
    print(f"node {st['node_id']}  host {st['hostname']}")
    if isinstance(st.get("sandbox"), dict):
        print(_sandbox_line(st["sandbox"]))
    if st.get("fault"):
        print(faults.describe(st["fault"]) if st["fault"] in faults.FAULTS
              else f"FAULT INJECTED: {st['fault']}")
    cols = ["module", "service", "lifecycle", "health", "running", "ready", "users", "pid",
            "uptime_s", "idle_stop_in_s", "restarts", "last_stop_reason", "withdrawn", "held",
            "error"]
    rows = [[_cell(r.get(c)) for c in cols] for r in st["services"]]
    _table(cols, rows)
    for r in st["services"]:  # stopped by demand eviction: for which job
        if r.get("evicted_for") and not r.get("running"):
            print(f"EVICTED {r['module']}/{r['service']}: to make room for {r['evicted_for']}")
    for module, why in (st.get("modules_refused") or {}).items():  # loaded nothing of these
        print(f"REFUSED {module}: {why}")
    for module, envs in (st.get("module_envs") or {}).items():  # its own environments
        for req, digest in envs.items():
            print(f"ENV {module} {req}: {st.get('state_dir', '<state>')}/envs/{digest}")
    for module, h in (st.get("runners") or {}).items():  # what a runner's doctor said, if not healthy
        if h.get("health") != "healthy":
            print(f"RUNNER {str(h.get('health')).upper()} {module}: {h.get('reason')}")
    print()
    page = st.get("jobs_page")
    if page is not None:
        shown = len(st["jobs"])
        print(f"jobs: {shown} of {st.get('jobs_total', shown)} (page {page['page']} of "
              f"{page['pages']}, most recent first; --page N for older, --per-page 0 for all)")
    # wire_attempt: the number a service logs for the latest attempt (contract section 3)
    jcols = ["job_id", "module", "stage", "state", "attempts", "wire_attempt", "exit_code",
             "reason"]
    _table(jcols, [[_cell(j.get(c)) for c in jcols] for j in st["jobs"]])
    after = st.get("jobs_after_restart") or {}
    if after.get("collected") or after.get("rerun"):  # recovery.after_restart
        print(f"after agent restarts: {after.get('collected', 0)} job(s) collected (their "
              f"runner had finished), {after.get('rerun', 0)} re-run")
    refused = st.get("sandbox_refusals") or {}
    if refused:  # network attempts the sandbox refused, per service / attempt (refusals.py)
        print()
        _table(["sandbox_refusals", "count", "last"],
               [[k, str(v["count"]), v["last"]] for k, v in refused.items()])
    return 0


def _sandbox_line(sb: dict[str, Any]) -> str:
    """``sandbox (auto): endpoints enforced; enforced: a, b; unavailable: c`` (+ note/fault)."""
    caps = {k: v for k, v in sb.items() if k not in ("mode", "note", "fault", "endpoints")}
    on = [k for k, v in caps.items() if v == "enforced"]
    off = [k for k, v in caps.items() if v != "enforced"]
    line = (f"sandbox ({sb.get('mode', '?')}): endpoints {sb.get('endpoints', '?')}; "
            f"enforced: {', '.join(on) or 'none'}; unavailable: {', '.join(off) or 'none'}")
    for extra in ("note", "fault"):
        if sb.get(extra):
            line += f"\n  {extra}: {sb[extra]}"
    return line


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def _table(cols: list[str], rows: list[list[str]]) -> None:
    if not rows:
        print("(no " + ("services" if "service" in cols else "jobs") + ")")
        return
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
