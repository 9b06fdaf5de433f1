"""``oarbank-agent run``: one ``AgentConfig`` from the flags and the config file, everything the
agent needs installed before it starts (log, sandbox, refusals, containment, the process
factory), then the agent itself until it stops.

Exit codes: 0 a clean stop; 1 a required sandbox or containment is unavailable; 2 a bad
option, config key or state dir (nothing started).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

from oarbank_agent import faults, platform
from oarbank_agent.operate import config, control, logsetup, protect_cli
from oarbank_agent.operate.cli_common import err as _err
from oarbank_agent.operate.run_options import run_options
from oarbank_agent.platform.api import EndpointPathTooLong

__all__ = ["cmd_run", "run_args"]


def run_args(run_argv: list[str]) -> config.RunArgs:
    from oarbank_agent.modules.loaded import read_settings_arg

    return config.load_run_args(run_argv, run_options, read_settings_arg)


def cmd_run(ra: config.RunArgs, run_argv: list[str]) -> int:
    from oarbank_agent.agent import Agent, AgentConfig
    from oarbank_agent.operate import nodeid
    from oarbank_agent.services import overrides

    args = ra.args

    try:
        # Before anything starts: where a deep path cannot be shortened, say so now.
        platform.current().endpoint.check(args.state_dir.resolve() / control.SOCKET_NAME)
    except EndpointPathTooLong as exc:
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
    if not args.env_grace_s >= 0:
        _err(f"--env-grace-s {args.env_grace_s:g}: must be >= 0")
        return 2
    if not args.keep_jobs_s > 0:
        _err(f"--keep-jobs-s {args.keep_jobs_s:g}: must be > 0 (seconds a finished job's "
             "record is kept)")
        return 2
    if not args.drain_s >= 0:
        _err(f"--drain-s {args.drain_s:g}: must be >= 0")
        return 2
    if not args.release_grace_s >= 0:
        _err(f"--release-grace-s {args.release_grace_s:g}: must be >= 0")
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
        sandboxing.set_undumpable()  # the agent's environment and memory: not its children's to read
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
    elif (args.portal_token_file is not None or args.portal_ca is not None
          or args.claim):
        _err("--portal-token-file, --portal-ca and --claim go with --portal")
        return 2
    if not 1 <= args.claim_wait_s <= 30:
        _err(f"--claim-wait-s {args.claim_wait_s:g}: must be from 1 to 30 (the portal holds a "
             "claim at most 30 s)")
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
    if args.keep_services and platform.current().keeper is None:
        _err(f"--keep-services: not available on {platform.current().name} yet (no keeper "
             "for the endpoint channels here)")
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
        # Children reaped on the loop, not a thread each, where the backend can (Python < 3.12).
        watcher = platform.current().groups.use_child_watcher(asyncio.get_running_loop())
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
            release_grace_s=args.release_grace_s,
            keep_jobs_s=args.keep_jobs_s, refresh_s=args.refresh_s,
            env_grace_s=args.env_grace_s, keep_services=args.keep_services))
        specs = [(p.resolve(), settings_for(p)) for p in args.modules or []]
        for msg in await agent.load_modules(specs):
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

        fleet = None
        if args.claim:
            from oarbank_agent.fleet.dispatch import FleetDispatch

            fleet = agent.fleet = FleetDispatch(agent, args.portal, token=portal_token,
                                                ca_file=args.portal_ca,
                                                wait_s=args.claim_wait_s)

        def ready() -> None:
            mods = ",".join(sorted(agent.modules)) or "-"
            print(f"oarbank-agent: ready node={agent.node.node_id} "
                  f"control={agent.control.path} modules={mods}", flush=True)
            if sender is not None:
                sender.start()  # the first report goes out at once, with fingerprinted rows
            if fleet is not None:
                fleet.start()  # what the records hold is renewed or reported, then claims

        textfile = None
        if args.metrics_textfile:
            from oarbank_agent.reporting.textfile import TextfileWriter

            textfile = TextfileWriter(args.metrics_textfile, agent, args.heartbeat_s)
            textfile.start()
        try:
            await agent.run(ready)
        finally:
            if fleet is not None:
                await fleet.aclose()  # results still owed: a few seconds to go out
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
        # Last: this may create where the agent's groups are held (containment).
        from oarbank_agent.sandbox import containment

        try:
            box = containment.resolve(args.containment, args.state_dir)
        except containment.ContainmentUnavailable as exc:
            _err(str(exc))
            return 1
        containment.install(box)  # before anything starts: every group is spawned and ended through it
        logging.getLogger("oarbank_agent").info("containment: %s (%s)", box.mode, box.note)
        try:
            return platform.current().loops.run(main_async())
        finally:
            box.close()  # an agent that never got going leaves nothing of its containment
    finally:
        lock.close()


# Options read once at start: a reload that finds them changed says they need a restart.
_RELOADABLE = ("settings", "config", "services")


def _reread(run_argv: list[str], first: config.RunArgs) -> Any:
    """For a reload: the same merge as at start, from the files as they are now."""
    from oarbank_agent.operate.reload import Reloaded

    now = run_args(run_argv)
    before, after = vars(first.args), vars(now.args)
    changed = sorted(k for k in after if k not in _RELOADABLE and before.get(k) != after[k])
    return Reloaded(now.settings, now.services,
                    [f"--{k.replace('_', '-')}" for k in changed])


async def _start_factory(mode: str, confine: bool) -> Any:
    """The process factory (``--process-factory``), installed for ``procs.spawn``; None when
    off or when it cannot start (children are then started directly: logged)."""
    from oarbank_agent import factory, platform

    use, why = factory.resolve_mode(mode, platform.current().name)  # the backend's, not the OS's
    log = logging.getLogger("oarbank_agent")
    if not use:
        log.info("process factory: %s", why)
        factory.install(None, why)
        return None
    try:
        backend = platform.current()
        maker = backend.factory.client(confine=confine, backend=backend)
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
    from oarbank_agent import platform
    from oarbank_agent.sandbox import refusals

    problem = None
    if enforce and platform.current().name == "linux":  # user notification is seccomp's
        from oarbank_sdk import sandbox

        problem = sandbox.notify_probe()
        if problem:
            logging.getLogger("oarbank_agent").warning(
                "network attempts are refused but not counted (seccomp user notification "
                "does not work here: %s)", problem)
    refusals.install(enforce and problem is None)
