"""``oarbank-agent run``'s options: each is also a key of the config file (config.py), and each
help is a row of the README's table (optiontable.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from oarbank_agent import platform
from oarbank_agent.operate import config, logsetup, protect_cli
from oarbank_agent.operate.options import Recorder
from oarbank_agent.platform.api import CONTAINMENT_HELP, CONTAINMENT_MODES

__all__ = ["PROG", "add_run_options", "run_options", "run_parser"]

PROG = "oarbank-agent run"


def add_run_options(r: argparse.ArgumentParser | Recorder) -> None:
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
                   help=f"on {platform.current().requests.stop_how} (or `oarbank-agent drain`) "
                        "running attempts get this long to finish before the rest are "
                        "released, not charged (default 30)")
    r.add_argument("--release-grace-s", type=float, default=10.0, metavar="S",
                   help="a job released by host protection whose runner accepts a stop "
                        "(cancellable) is asked to stop at a safe point and ended only after "
                        "this long (default 10)")
    r.add_argument("--refresh-s", type=float, default=20.0, metavar="S",
                   help="how often running services are fingerprinted again (health and pool "
                        "counts; also once right after each becomes ready; default 20)")
    r.add_argument("--keep-services", action="store_true",
                   help="endpoint services go on running when the agent stops or dies, their "
                        "channels held by a keeper process; the next agent on this state dir "
                        "takes each back when it is provably the same (no model reload). A "
                        "reboot still reloads (default off: each is stopped at a restart)")
    r.add_argument("--keep-jobs-s", type=float, default=7 * 86400.0, metavar="S",
                   help="a finished job's record and workdirs are removed this long after it "
                        "finished (default 604800: 7 days)")
    r.add_argument("--env-grace-s", type=float, default=3600.0, metavar="S",
                   help="a module environment (<state>/envs) no loaded module uses is removed "
                        "this long after it was first seen unused, at a --refresh-s sweep "
                        "(default 3600)")
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
    r.add_argument("--containment", choices=CONTAINMENT_MODES, default="auto",
                   help=CONTAINMENT_HELP)  # the modes are the platform backend's
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
                        "may read it (chmod 600; on Windows its DACL); a plain http:// portal "
                        "on another host gets a warning: the token would cross the network in "
                        "clear")
    r.add_argument("--portal-ca", metavar="FILE",
                   help="verify an https:// portal against this CA bundle (PEM) instead of "
                        "the system's")
    r.add_argument("--claim", action="store_true",
                   help="also run jobs submitted to the --portal (fleet dispatch, contract "
                        "section 10): long-polled claims while the node has room, saying its "
                        "services' states, free pool tokens, load and job times and memory; "
                        "leases renewed, results reported until acknowledged. Local `submit` "
                        "works beside it (default off)")
    r.add_argument("--claim-wait-s", type=float, default=20.0, metavar="S",
                   help="how long one claim waits on the portal for work (its long poll, 1 to "
                        "30; default 20): lower it behind a proxy that cuts idle requests; a "
                        "change of this node's services reaches the portal with the next claim")
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
    parser: argparse.ArgumentParser = run_options(cls).parser
    return parser


def run_options(cls: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> Recorder:
    """``run_parser``'s parser (``.parser``) and its options (``.actions``), each as added, in
    order: the README's table, the config file's keys."""
    rec = Recorder(cls(prog=PROG, add_help=False))
    add_run_options(rec)
    return rec
