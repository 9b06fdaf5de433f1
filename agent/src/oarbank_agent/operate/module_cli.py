"""``oarbank-agent module list | add DIR | disable ID [--now] | enable ID | remove ID [--now]
[--wait]``: modules on a running agent.

``list`` prints each loaded module (id, enabled or disabled, its services, its bundle) and
each one refused at start with the reason (``--json``: the agent's answer). ``disable`` stops
the module's services once their running attempts are over, refuses new jobs for it with the
reason, and keeps it disabled across agent restarts (``<state>/modules.json``); ``--now``
releases its running attempts at once (not charged: they wait for ``enable``). ``enable``
undoes it. ``add DIR`` loads a module folder on the running agent (checked and matched as at
start; refused with the reason) and keeps it loaded across restarts. ``remove`` takes a
module off the node for good (moduleremove.py): its new jobs are refused at once and its queued
ones fail with the reason, its running attempts finish (``--now``: released, and then they
fail too), its services stop, every object they own is destroyed (``list_owned``, ``destroy
<id> --force``) and it is forgotten, also across restarts, until ``module add`` loads it
again; ``module list`` says ``removing`` meanwhile, ``--wait`` answers once it is gone.
Exit codes as the other
control commands: 1 not running, 2 unknown module or bad use, 3 not permitted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from oarbank_agent.operate.cli_common import err as _err
from oarbank_agent.operate.cli_common import request as _request

__all__ = ["add_module_parser", "cmd_module"]


def add_module_parser(sub: Any) -> None:
    m = sub.add_parser("module", help="list, add, disable, enable or remove modules on a "
                       "running agent")
    acts = m.add_subparsers(dest="action", required=True)
    ls = acts.add_parser("list", help="the loaded modules, enabled or disabled, and the "
                         "refused ones with why")
    ls.add_argument("--state-dir", required=True, type=Path)
    ls.add_argument("--json", action="store_true")
    add = acts.add_parser("add", help="load a module folder now; kept across restarts")
    add.add_argument("--state-dir", required=True, type=Path)
    add.add_argument("path", type=Path, help="the module folder (oarbank-module.toml at its root)")
    for name, text in (("disable", "stop its services once their attempts are over, refuse "
                                   "its jobs; kept across restarts"),
                       ("enable", "undo disable"),
                       ("remove", "refuse its jobs, fail its queued ones, stop its services "
                                  "once their attempts are over, destroy what it owns and "
                                  "forget it; kept across restarts")):
        a = acts.add_parser(name, help=text)
        a.add_argument("--state-dir", required=True, type=Path)
        a.add_argument("module", help="module id or short name")
        if name in ("disable", "remove"):
            a.add_argument("--now", action="store_true",
                           help="release its running attempts now (not charged)")
        if name == "remove":
            a.add_argument("--wait", action="store_true",
                           help="answer once the module is gone (its attempts may run long)")


def cmd_module(args: argparse.Namespace) -> int:
    req: dict[str, Any] = {"op": "module", "action": args.action}
    if args.action == "add":
        req["path"] = str(args.path.resolve())
    elif args.action != "list":
        req.update(module=args.module, now=bool(getattr(args, "now", False)))
    wait = bool(getattr(args, "wait", False))
    if wait:
        req["wait"] = True
    # add: no limit here either (its environment's install may take minutes: envs.py bounds it)
    reply = _request(args.state_dir, req, None if wait or args.action == "add" else 30.0)
    if isinstance(reply, int):
        return reply
    if not reply.get("ok"):
        _err(reply.get("error", "module refused"))
        return 2 if reply.get("code") in ("unknown_module", "bad_request") else 1
    if getattr(args, "json", False):
        print(json.dumps(reply, indent=1))
        return 0
    if args.action == "remove":
        _print_removal(reply)
    for m in reply["modules"]:
        print(f"{m['id']}  {m['state']}  services: {', '.join(m['services']) or '-'}  "
              f"{m['bundle']}")
    for module, why in (reply.get("refused") or {}).items():
        print(f"{module}  refused  {why}")
    return 0


def _print_removal(reply: dict[str, Any]) -> None:
    failed = reply.get("failed") or []
    if failed:
        print(f"failed (module removed): {', '.join(failed)}")
    if "removed" in reply:
        for problem in reply.get("problems") or []:
            print(f"problem: {problem}")
        print(f"{reply['removed']}  removed")
    else:
        print(f"{reply['removing']}  removing: its services stop once its running attempts "
              "are over, then what it owns is destroyed and it is forgotten "
              "(`module list` shows it until then)")
