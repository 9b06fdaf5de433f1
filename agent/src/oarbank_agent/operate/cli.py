"""``oarbank-agent``: run | submit | status | drain | reload | protect | demo.

Exit codes: 0 success (``submit --wait``: the job succeeded); 1 the agent is not running, the
job failed, or ``--timeout`` expired; 2 bad usage or input (malformed JSON, unknown module or
stage, a bad option or config key): nothing queued; 3 not permitted to reach the agent (its
control socket is its user's alone).
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

from oarbank_agent import faults
from oarbank_agent.operate import config, control, logsetup, protect_cli
from oarbank_agent.operate.cli_common import EXIT_NOT_PERMITTED, EXIT_NOT_RUNNING
from oarbank_agent.operate.cli_common import err as _err
from oarbank_agent.operate.cli_common import not_permitted as _not_permitted
from oarbank_agent.operate.cli_common import request as _request
from oarbank_agent.operate.module_cli import add_module_parser, cmd_module

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oarbank-agent", description="The oarbank node agent.")
    from oarbank_agent.modules.compat import version_line  # what a module's [requires] is matched against

    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run the agent in the foreground until SIGTERM/SIGINT "
                       "(SIGTERM drains, SIGHUP reloads)")
    add_run_options(r)
    _add_commands(p, sub)
    return p


def add_run_options(r: argparse.ArgumentParser) -> None:
    """Every ``run`` option; each is also a key of the config file (config.py)."""
    r.add_argument("--config", type=Path, metavar="FILE",
                   help=f"a TOML file with any of these options as keys (default: "
                        f"{config.DEFAULT_PATH} when it exists); flags override it")
    r.add_argument("--state-dir", type=Path, metavar="DIR",
                   help="required: the agent's own folder (records, sockets, logs); reusing "
                        "it after a crash resumes the jobs")
    r.add_argument("--module", action="append", type=Path, dest="modules",
                   metavar="MODULE_DIR",
                   help="required, repeatable: a module folder (oarbank-module.toml at its root)")
    r.add_argument("--node-id", metavar="ID",
                   help="this node's id (default: the host name); kept in the state dir after "
                        "the first run: a different one later is refused without --rename-node")
    r.add_argument("--rename-node", action="store_true",
                   help="accept a --node-id different from the one the state dir keeps")
    r.add_argument("--drain-s", type=float, default=30.0, metavar="S",
                   help="on SIGTERM (or `oarbank-agent drain`) running attempts get this long "
                        "to finish before the rest are released, not charged (default 30)")
    r.add_argument("--refresh-s", type=float, default=20.0, metavar="S",
                   help="how often running services are fingerprinted again (health and pool "
                        "counts; also once right after each becomes ready; default 20)")
    r.add_argument("--keep-jobs-s", type=float, default=7 * 86400.0, metavar="S",
                   help="a finished job's record and workdirs are removed this long after it "
                        "finished (default 604800: 7 days)")
    r.add_argument("--log-file", type=Path, metavar="PATH",
                   help="write the agent's log here instead of stderr, rotated by size")
    r.add_argument("--log-max-mb", type=float, default=logsetup.DEFAULT_MAX_MB, metavar="MB",
                   help=f"rotate --log-file (and each service log) at this size (default "
                        f"{logsetup.DEFAULT_MAX_MB:g})")
    r.add_argument("--log-backups", type=int, default=logsetup.DEFAULT_BACKUPS, metavar="N",
                   help=f"rotated files kept per log (default {logsetup.DEFAULT_BACKUPS})")
    r.add_argument("--log-level", choices=logsetup.LEVELS, default="info",
                   help="least level logged (default info; warning: only what needs action)")
    r.add_argument("--log-format", choices=logsetup.FORMATS, default="text",
                   help="text (default) or json: one object per line (time, level, event, "
                        "module, service, job, attempt)")
    r.add_argument("--allow-empty", action="store_true",
                   help="run even when no --module could be loaded (by default that exits 2)")
    r.add_argument("--settings", action="append", default=[], metavar="MODULE=FILE",
                   help="this node's settings (JSON object) for a module (id or short name), "
                        "written to its settings.json; without it settings.json is left as it is")
    r.add_argument("--sandbox", choices=("auto", "required", "off"), default="auto",
                   help="confine every runner, service op and daemon: auto (default: when "
                        "this machine allows), required (refuse to start without it), off "
                        "(debugging only: everything runs unconfined)")
    r.add_argument("--containment", choices=("auto", "cgroup", "process-group"),
                   default="auto",
                   help="how an attempt's (and a service's) processes are ended: auto "
                        "(default: a cgroup each where cgroup v2 is usable, else the process "
                        "group), cgroup (refuse to start without it), process-group")
    r.add_argument("--process-factory", choices=("on", "off"), default="on",
                   help="start every runner, service op and daemon from one warm helper "
                        "process (a fork server: on, the default, on Linux; elsewhere off) or "
                        "each directly (off)")
    protect_cli.add_run_options(r)
    r.add_argument("--portal", metavar="URL",
                   help="post heartbeats here: http://HOST:PORT[/prefix], "
                        "https://HOST[:PORT][/prefix] or unix:/path/to/socket "
                        "(<prefix>/v1/heartbeat)")
    r.add_argument("--portal-token-file", metavar="FILE",
                   help="this node's portal token (`oarbank-portal token issue NODE_ID`), "
                        "sent as Authorization: Bearer; refused (exit 2) unless only the owner "
                        "may read it (chmod 600); a plain http:// portal on another host gets "
                        "a warning: the token would cross the network in clear")
    r.add_argument("--portal-ca", metavar="FILE",
                   help="verify an https:// portal against this CA bundle (PEM) instead of "
                        "the system's")
    r.add_argument("--metrics-textfile", metavar="PATH",
                   help="write this node's figures (jobs and services by state, attempts, "
                        "sandbox refusals, heartbeat posts and refusals) here for "
                        "node_exporter's textfile collector: a .prom file replaced atomically "
                        "every heartbeat period and once more on stop, mode 0644")
    r.add_argument("--heartbeat-s", type=float, default=10.0, metavar="S",
                   help="heartbeat period in seconds (default 10; sent in each report as "
                        "heartbeat_s: the portal calls the node stale after 3 of them); every "
                        "service state change also posts at once")
    r.add_argument("--manual-refresh-s", type=float, default=30.0, metavar="S",
                   help="how often `manual` services are fingerprinted again (default 30)")
    r.add_argument("--status-poll-s", type=float, default=10.0, metavar="S",
                   help="first interval of the `status` polls of a non-endpoint service that "
                        "left nothing in its process group (doubling to 6x; default 10)")


def run_parser(cls: type[argparse.ArgumentParser] = argparse.ArgumentParser
               ) -> argparse.ArgumentParser:
    """``run``'s options alone (config.py parses the config file's values through it)."""
    r = cls(prog="oarbank-agent run", add_help=False)
    add_run_options(r)
    return r


def _add_commands(p: argparse.ArgumentParser, sub: Any) -> None:
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
    st.add_argument("--page", type=int, default=1,
                    help="which page of jobs: 1 (default) the most recent")
    st.add_argument("--per-page", "--jobs", type=int, default=50, metavar="N",
                    help="jobs per page: --jobs N shows the last N (default 50; 0: every job), "
                         "with a count of the rest")

    for name, text in (("drain", "stop admitting, let running attempts finish (up to the "
                                 "agent's --drain-s), then stop the agent (as SIGTERM)"),
                       ("reload", "re-read the config and settings files, apply new timings, "
                                  "fingerprint again (as SIGHUP)")):
        c = sub.add_parser(name, help=text)
        c.add_argument("--state-dir", required=True, type=Path)

    protect_cli.add_protect_parser(sub)
    add_module_parser(sub)

    d = sub.add_parser("demo", help="twenty jobs through one warm model service")
    d.add_argument("--jobs", type=int, default=20)
    d.add_argument("--load-s", type=float, default=1.0)
    d.add_argument("--json", action="store_true")
    d.add_argument("--sandbox", choices=("auto", "required", "off"), default="auto",
                   help="the agent's --sandbox (off: debugging only)")
    d.add_argument("--compare", action="store_true",
                   help="then run the same jobs cold (each loads the model itself) and "
                        "print both")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if args.command == "run":
        run_argv = argv[argv.index("run") + 1:]
        try:
            ra = _run_args(run_argv)
        except ValueError as exc:  # ConfigError, SettingsError: each names the file and key
            _err(str(exc))
            return 2
        return cmd_run(ra, run_argv)
    if args.command in ("drain", "reload"):
        return cmd_control(args)
    if args.command == "submit":
        return cmd_submit(args)
    if args.command == "status":
        return cmd_status(args)
    if args.command == "protect":
        return protect_cli.cmd_protect(args)
    if args.command == "module":
        return cmd_module(args)
    from oarbank_agent.operate.demo import run_demo

    return run_demo(jobs=args.jobs, load_s=args.load_s, as_json=args.json,
                    sandbox=args.sandbox, compare=args.compare)


def _run_args(run_argv: list[str]) -> config.RunArgs:
    from oarbank_agent.modules.loaded import read_settings_arg

    return config.load_run_args(run_argv, run_parser, read_settings_arg)


def cmd_run(ra: config.RunArgs, run_argv: list[str]) -> int:
    from oarbank_agent.agent import Agent, AgentConfig
    from oarbank_agent.host.unixpath import SocketPathTooLong, check
    from oarbank_agent.operate import nodeid
    from oarbank_agent.services import overrides

    args = ra.args

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
    try:
        logsetup.configure(logsetup.LogOptions(
            level=args.log_level, fmt=args.log_format, file=args.log_file,
            max_mb=args.log_max_mb, backups=args.log_backups))
    except ValueError as exc:
        _err(str(exc))
        return 2
    except OSError as exc:
        _err(f"--log-file {args.log_file}: cannot write it: {exc.strerror}")
        return 2
    if not args.refresh_s > 0:
        _err(f"--refresh-s {args.refresh_s:g}: must be > 0")
        return 2
    if not args.keep_jobs_s > 0:
        _err(f"--keep-jobs-s {args.keep_jobs_s:g}: must be > 0 (seconds a finished job's "
             "record is kept)")
        return 2
    if not args.drain_s >= 0:
        _err(f"--drain-s {args.drain_s:g}: must be >= 0")
        return 2
    from oarbank_agent.services import servicelog

    # Each service's log (its daemon's stderr, collected by the agent) rotates the same way.
    servicelog.configure(int(args.log_max_mb * 2**20), args.log_backups)
    log = logging.getLogger("oarbank_agent")
    if ra.config_path is not None:
        log.info("config: %s", ra.config_path)
    from oarbank_agent.sandbox import policy as sandboxing

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
        from oarbank_agent.reporting.heartbeat import PortalURL, read_token_file

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
    settings = ra.settings

    def settings_for(path: Path) -> dict[str, Any] | None:
        """The settings given for this module; None: its settings.json is left as it is."""
        from oarbank_sdk import manifest as mf

        try:
            m = mf.load(path)
        except mf.ManifestError:
            return None  # refused below with the checker's messages
        return settings.get(m.id, settings.get(m.short_name))

    async def main_async() -> int:
        # Children reaped through pidfds, not a thread each (Python < 3.12 on Linux).
        from oarbank_agent.host.pidfd import use_child_watcher

        watcher = use_child_watcher(asyncio.get_running_loop())
        logging.getLogger("oarbank_agent").debug("child watcher: %s", watcher)
        maker = await _start_factory(args.process_factory, policy.enforce)
        try:
            return await run_agent()
        finally:
            if maker is not None:
                await maker.close()

    async def run_agent() -> int:
        agent = Agent(AgentConfig(
            state_dir=args.state_dir, node_id=node_id, guard=guard_config,
            gpu=gpu_override, manual_refresh_s=args.manual_refresh_s,
            status_poll_s=args.status_poll_s, fault=fault, drain_s=args.drain_s,
            keep_jobs_s=args.keep_jobs_s, refresh_s=args.refresh_s))
        specs = [(p.resolve(), settings_for(p)) for p in args.modules or []]
        for msg in agent.load_modules(specs):
            print(msg, file=sys.stderr)
        unknown = [n for n in settings  # (a module removed here is not loaded: module remove)
                   if agent.find_module(n) is None and n not in agent.modules
                   and n not in agent.gone]
        if unknown:
            _err(f"--settings for a module that is not loaded: {', '.join(unknown)}")
        if not agent.modules and not args.allow_empty and not agent.gone:
            _err("no module could be loaded: each refusal above says why (fix the manifest, "
                 "check it with `oarbank-sdk check`, or run with --allow-empty)")
            return 2
        manifest_services = {key: rt.svc for key, rt in agent.supervisor.services.items()}
        try:
            for line in overrides.apply(agent.supervisor, ra.services, manifest_services,
                                        live=False):
                log.info("config: %s", line)
        except overrides.OverrideError as exc:
            _err(f"--config {ra.config_path}: {exc}")
            return 2
        agent.reload_source = lambda: _reread(run_argv, ra)
        _release_on_factory_loss(agent)

        sender = None
        if args.portal:
            from oarbank_agent.reporting.heartbeat import HeartbeatSender

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
            from oarbank_agent.reporting.textfile import TextfileWriter

            textfile = TextfileWriter(args.metrics_textfile, agent, args.heartbeat_s)
            textfile.start()
        try:
            await agent.run(ready)
        finally:
            servicelog.close_all()  # every daemon is gone: what its pipe still held is written
            if textfile is not None:
                await textfile.aclose()
            if sender is not None:
                # The services are stopped by now: the portal hears it from us, not from
                # three missed periods.
                await sender.send_last()
        return 0

    # Once the arguments are good, before anything reads or writes the state dir: ours alone
    # (0700, our user's), and locked: a second agent on it exits here (statedir.py).
    from oarbank_agent.operate import statedir

    os.umask(statedir.UMASK)  # every file the agent writes is 0600, every folder 0700
    try:
        lock = statedir.prepare(args.state_dir)
    except statedir.StateDirError as exc:
        _err(f"--state-dir: {exc}")
        return 2
    try:
        try:  # under the lock: two agents never race on the kept id
            node_id, how = nodeid.resolve(args.state_dir, args.node_id, rename=args.rename_node)
        except nodeid.NodeIdError as exc:
            _err(str(exc))
            return 2
        log.info("node id %s (%s)", node_id, how)
        # Last: this may create the agent's cgroup.
        from oarbank_agent.sandbox import containment

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


# Options read once at start: a reload that finds them changed says they need a restart.
_RELOADABLE = ("settings", "config", "services")


def _reread(run_argv: list[str], first: config.RunArgs) -> Any:
    """For a reload: the same merge as at start, from the files as they are now."""
    from oarbank_agent.operate.reload import Reloaded

    now = _run_args(run_argv)
    before, after = vars(first.args), vars(now.args)
    changed = sorted(k for k in after if k not in _RELOADABLE and before.get(k) != after[k])
    return Reloaded(now.settings, now.services,
                    [f"--{k.replace('_', '-')}" for k in changed])


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


async def _start_factory(mode: str, confine: bool) -> Any:
    """The process factory (``--process-factory``), installed for ``procs.spawn``; None when
    off or when it cannot start (children are then started directly: logged)."""
    from oarbank_agent import factory

    use, why = factory.resolve_mode(mode, sys.platform)
    log = logging.getLogger("oarbank_agent")
    if not use:
        log.info("process factory: %s", why)
        factory.install(None, why)
        return None
    from oarbank_agent.factory.client import FactoryClient

    maker = FactoryClient(confine=confine)
    try:
        await maker.start()
    except OSError as exc:
        log.warning("process factory: cannot start it (%s): children are started directly",
                    exc)
        factory.install(None, f"off: it could not start ({exc}): children are started directly")
        return None
    factory.install(maker)
    return maker


def _release_on_factory_loss(agent: Any) -> None:
    """A factory that dies takes its children's statuses along: their jobs are released
    (requeued, not charged) and run again (factory/client.py)."""
    from oarbank_agent import factory

    maker = factory.current()
    if maker is not None:
        maker.on_lost = lambda lost: agent.queue.release(
            [p.label.rsplit(".", 1)[0] for p in lost if p.kind == "runner"],
            "the process factory died under the attempt")


def _install_refusals(enforce: bool) -> None:
    """Count each network attempt of every child (refusals.py) when user notification works
    here; the filter refuses them either way."""
    from oarbank_agent.sandbox import refusals

    problem = None
    if enforce and sys.platform.startswith("linux"):
        from oarbank_sdk import sandbox

        problem = sandbox.notify_probe()
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
    for module, why in (st.get("modules_refused") or {}).items():  # loaded nothing of these
        print(f"REFUSED {module}: {why}")
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
