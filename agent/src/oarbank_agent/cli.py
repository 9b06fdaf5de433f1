"""``oarbank-agent``: run | submit | status | demo.

Exit codes: 0 success (``submit --wait``: the job succeeded); 1 the agent is not running, the
job failed, or ``--timeout`` expired; 2 bad usage or input (malformed JSON, unknown module or
stage): nothing queued.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from . import control, faults, protect_cli

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oarbank-agent", description="The oarbank node agent.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run the agent in the foreground until SIGTERM/SIGINT")
    r.add_argument("--state-dir", required=True, type=Path)
    r.add_argument("--module", action="append", required=True, type=Path, dest="modules",
                   metavar="MODULE_DIR")
    r.add_argument("--node-id")
    r.add_argument("--allow-empty", action="store_true",
                   help="run even when no --module could be loaded (by default that exits 2)")
    r.add_argument("--settings", action="append", default=[], metavar="MODULE=FILE",
                   help="this node's settings (JSON object) for a module (id or short name)")
    r.add_argument("--sandbox", choices=("auto", "required", "off"), default="auto",
                   help="confine every runner, service op and daemon: auto (default: when "
                        "this machine allows), required (refuse to start without it), off "
                        "(debugging only: everything runs unconfined)")
    r.add_argument("--containment", choices=("auto", "cgroup", "process-group"),
                   default="auto",
                   help="how an attempt's (and a service's) processes are ended: auto "
                        "(default: a cgroup each where cgroup v2 is usable, else the process "
                        "group), cgroup (refuse to start without it), process-group")
    protect_cli.add_run_options(r)
    r.add_argument("--portal", metavar="URL",
                   help="post heartbeats here: http://127.0.0.1:PORT, https://HOST[:PORT] or "
                        "unix:/path/to/socket")
    r.add_argument("--portal-token-file", metavar="FILE",
                   help="this node's portal token (`oarbank-portal token issue NODE_ID`), "
                        "sent as Authorization: Bearer; must not be readable by group/others")
    r.add_argument("--portal-ca", metavar="FILE",
                   help="verify an https:// portal against this CA bundle (PEM) instead of "
                        "the system's")
    r.add_argument("--metrics-textfile", metavar="PATH",
                   help="write this node's figures here for node_exporter's textfile "
                        "collector (a .prom file, replaced atomically every heartbeat period)")
    r.add_argument("--heartbeat-s", type=float, default=10.0, metavar="S",
                   help="heartbeat period in seconds (default 10); state changes post at once")
    r.add_argument("--manual-refresh-s", type=float, default=30.0, metavar="S",
                   help="how often `manual` services are fingerprinted again (default 30)")
    r.add_argument("--status-poll-s", type=float, default=10.0, metavar="S",
                   help="first interval of the `status` polls of a non-endpoint service that "
                        "left nothing in its process group (doubling to 6x; default 10)")

    s = sub.add_parser("submit", help="submit a job to a running agent")
    s.add_argument("--state-dir", required=True, type=Path)
    s.add_argument("--module", required=True, help="module id or short name")
    s.add_argument("--stage", required=True)
    s.add_argument("--payload", required=True, help="the job's payload, a JSON object")
    s.add_argument("--wait", action="store_true", help="wait and print the final job record")
    s.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds")

    st = sub.add_parser("status", help="services and jobs of a running agent")
    st.add_argument("--state-dir", required=True, type=Path)
    st.add_argument("--json", action="store_true")

    protect_cli.add_protect_parser(sub)

    d = sub.add_parser("demo", help="twenty jobs through one warm model service")
    d.add_argument("--jobs", type=int, default=20)
    d.add_argument("--load-s", type=float, default=1.0)
    d.add_argument("--json", action="store_true")
    d.add_argument("--sandbox", choices=("auto", "required", "off"), default="auto",
                   help="the agent's --sandbox (off: debugging only)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "submit":
        return cmd_submit(args)
    if args.command == "status":
        return cmd_status(args)
    if args.command == "protect":
        return protect_cli.cmd_protect(args)
    from .demo import run_demo

    return run_demo(jobs=args.jobs, load_s=args.load_s, as_json=args.json,
                    sandbox=args.sandbox)


def _err(msg: str) -> None:
    print(f"oarbank-agent: {msg}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from .agent import Agent, AgentConfig, configure_logging
    from .modules import SettingsError, read_settings_arg
    from .unixpath import SocketPathTooLong, check

    try:
        # Before anything starts: where a deep path cannot be shortened, say so now.
        check(args.state_dir.resolve() / control.SOCKET_NAME)
    except SocketPathTooLong as exc:
        _err(f"--state-dir: {exc}")
        return 2
    try:
        fault = faults.from_env(os.environ)  # test-only fault injection (faults.py)
    except ValueError as exc:
        _err(str(exc))
        return 2
    if fault is not None:
        _err(faults.describe(fault))  # loud: also logged and shown in status
    configure_logging()
    from . import sandboxing

    try:
        policy = sandboxing.resolve(args.sandbox)
    except sandboxing.SandboxUnavailable as exc:
        _err(str(exc))
        return 1
    sandboxing.install(policy)  # before anything is started: every child goes through it
    _install_refusals(policy.enforce)
    if policy.enforce:
        sandboxing.set_undumpable()  # /proc/<agent>/environ, mem, ...: not for its children
    policy.warn_missing()  # auto on a kernel lacking walls: one WARNING naming each
    if not policy.enforce:
        _err(policy.report()["note"])
        if policy.fault:
            _err(f"OARBANK_SANDBOX_FAULT={policy.fault} ignored: no launcher is used")
    try:
        guard_config, gpu_override = protect_cli.config_from_args(args)
    except ValueError as exc:
        _err(str(exc))
        return 2
    portal_token = None
    if args.portal is not None:
        from .heartbeat import PortalURL, read_token_file

        try:
            url = PortalURL(args.portal)
        except ValueError as exc:
            _err(f"--portal: {exc}")
            return 2
        if args.portal_ca is not None and not url.tls:
            _err("--portal-ca is for an https:// --portal")
            return 2
        if args.portal_ca is not None:
            import ssl

            try:  # a CA file that cannot be read fails here, not in the heartbeat task
                ssl.create_default_context(cafile=args.portal_ca)
            except (OSError, ssl.SSLError) as exc:
                _err(f"--portal-ca {args.portal_ca}: not a readable PEM CA bundle ({exc})")
                return 2
        if args.portal_token_file is not None:
            try:
                portal_token = read_token_file(args.portal_token_file)
            except ValueError as exc:
                _err(f"--portal-token-file {exc}")
                return 2
            if not url.private:
                logging.getLogger("oarbank_agent").warning(
                    "--portal %s is plain http to another host: the node token crosses the "
                    "network in clear; use https://", args.portal)
    elif args.portal_token_file is not None or args.portal_ca is not None:
        _err("--portal-token-file and --portal-ca go with --portal")
        return 2
    if args.heartbeat_s <= 0:
        _err("--heartbeat-s must be > 0")
        return 2
    if not args.manual_refresh_s > 0:
        _err("--manual-refresh-s must be > 0")
        return 2
    if not args.status_poll_s > 0:
        _err("--status-poll-s must be > 0")
        return 2
    settings: dict[str, dict[str, Any]] = {}
    for arg in args.settings:
        try:
            name, value = read_settings_arg(arg)
        except SettingsError as exc:
            _err(str(exc))
            return 2
        settings[name] = value

    def settings_for(path: Path) -> dict[str, Any]:
        from oarbank_sdk import manifest as mf

        try:
            m = mf.load(path)
        except mf.ManifestError:
            return {}  # refused below with the checker's messages
        return settings.get(m.id, settings.get(m.short_name, {}))

    async def main_async() -> int:
        # Children reaped through pidfds, not a thread each (Python < 3.12 on Linux).
        from .childwatch import use_pidfd_watcher

        watcher = use_pidfd_watcher(asyncio.get_running_loop())
        logging.getLogger("oarbank_agent").debug("child watcher: %s", watcher)
        agent = Agent(AgentConfig(
            state_dir=args.state_dir, node_id=args.node_id, guard=guard_config,
            gpu=gpu_override, manual_refresh_s=args.manual_refresh_s,
            status_poll_s=args.status_poll_s, fault=fault))
        specs = [(p.resolve(), settings_for(p)) for p in args.modules]
        for msg in agent.load_modules(specs):
            print(msg, file=sys.stderr)
        unknown = [n for n in settings
                   if agent.find_module(n) is None and n not in agent.modules]
        if unknown:
            _err(f"--settings for a module that is not loaded: {', '.join(unknown)}")
        if not agent.modules and not args.allow_empty:
            _err("no module could be loaded: each refusal above says why (fix the manifest, "
                 "check it with `oarbank-sdk check`, or run with --allow-empty)")
            return 2

        sender = None
        if args.portal:
            from .heartbeat import HeartbeatSender

            sender = HeartbeatSender(args.portal, agent.report, args.heartbeat_s,
                                     token=portal_token, ca_file=args.portal_ca)
            agent.heartbeat = sender  # `status` shows what the portal does with our reports
            # Every service state change posts at once (debounced by the sender).
            agent.on_change.append(lambda _key: sender.notify_change())

        def ready() -> None:
            mods = ",".join(sorted(agent.modules)) or "-"
            print(f"oarbank-agent: ready node={agent.node.node_id} "
                  f"control={agent.control.path} modules={mods}", flush=True)
            if sender is not None:
                sender.start()  # the first report goes out at once, with fingerprinted rows

        textfile = None
        if args.metrics_textfile:
            from .textfile import TextfileWriter

            textfile = TextfileWriter(args.metrics_textfile, agent, args.heartbeat_s)
            textfile.start()
        try:
            await agent.run(ready)
        finally:
            if textfile is not None:
                await textfile.aclose()
            if sender is not None:
                # The services are stopped by now: the portal hears it from us, not from
                # three missed periods.
                await sender.send_last()
        return 0

    # Once the arguments are good, before anything reads or writes the state dir: ours alone
    # (0700, our user's), and locked: a second agent on it exits here (statedir.py).
    from . import statedir

    os.umask(statedir.UMASK)  # every file the agent writes is 0600, every folder 0700
    try:
        lock = statedir.prepare(args.state_dir)
    except statedir.StateDirError as exc:
        _err(f"--state-dir: {exc}")
        return 2
    try:
        # Last: this may create the agent's cgroup.
        from . import containment

        try:
            box = containment.resolve(args.containment, args.state_dir)
        except containment.ContainmentUnavailable as exc:
            _err(str(exc))
            return 1
        containment.install(box)  # before anything starts: every group is spawned and ended through it
        logging.getLogger("oarbank_agent").info("containment: %s (%s)", box.mode, box.note)
        try:
            return asyncio.run(main_async())
        finally:
            box.close()  # an agent that never got going leaves no empty cgroup behind
    finally:
        lock.close()


def _install_refusals(enforce: bool) -> None:
    """Count each network attempt of every child (refusals.py) when user notification works
    here; the filter refuses them either way."""
    from . import refusals

    problem = None
    if enforce and sys.platform.startswith("linux"):
        from oarbank_sdk.sandbox import _notify

        problem = _notify.probe()
        if problem:
            logging.getLogger("oarbank_agent").warning(
                "network attempts are refused but not counted (seccomp user notification "
                "does not work here: %s)", problem)
    refusals.install(enforce and problem is None)


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
                                                  "exceeds_memory_budget") else 1
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
        return 1
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
    try:
        reply = control.request(args.state_dir, {"op": "status"})
    except control.AgentNotRunning as exc:
        _err(str(exc))
        return 1
    except (OSError, ValueError) as exc:
        _err(f"lost the agent: {exc}")
        return 1
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
    cols = ["module", "service", "lifecycle", "health", "running", "ready", "users", "withdrawn",
            "held", "error"]
    rows = [[_cell(r.get(c)) for c in cols] for r in st["services"]]
    _table(cols, rows)
    print()
    # wire_attempt: the number a service logs for the latest attempt (contract section 3)
    jcols = ["job_id", "module", "stage", "state", "attempts", "wire_attempt", "exit_code",
             "reason"]
    _table(jcols, [[_cell(j.get(c)) for c in jcols] for j in st["jobs"]])
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


if __name__ == "__main__":
    sys.exit(main())
