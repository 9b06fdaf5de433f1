"""Command line of host protection: the ``run`` options and ``oarbank-agent protect``.

``run`` options (all optional):

- ``--memory-budget-gb GB``: memory for fleet work on this node (default: half of total).
- ``--mem-soft-floor F`` / ``--mem-hard-floor F``: available memory that must remain, as a
  fraction (``0.12``) or a percentage (``12%``); defaults 12% / 8%.
- ``--mem-recover-margin F``: pressure ends once available memory is this much above the soft
  floor (default 3%; hysteresis, so services do not flap).
- ``--mem-sample-s S``: how often memory is sampled (default 2 s; tests use less).
- ``--gpu-apis LIST``: replaces GPU detection, e.g. ``cuda,vulkan`` or ``none``.

``oarbank-agent protect --state-dir DIR [--forbid-gpu | --allow-gpu | --evict | --end-evict]``
sets a host rule on the running agent and prints the rules and held services as JSON (with
no rule: just prints them). ``--evict`` stays in force until ``--end-evict``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from oarbank_agent.host import gpuapis
from oarbank_agent.operate import control
from oarbank_agent.operate.cli_common import EXIT_NOT_PERMITTED, not_permitted
from oarbank_agent.operate.options import Recorder
from oarbank_agent.protection.decisions import Floors, parse_fraction
from oarbank_agent.protection.guard import DEFAULT_SAMPLE_S, GuardConfig

__all__ = ["add_run_options", "config_from_args", "add_protect_parser", "cmd_protect"]

def add_run_options(r: argparse.ArgumentParser | Recorder) -> None:
    g = r.add_argument_group("host protection")
    g.add_argument("--memory-budget-gb", type=float, metavar="GB",
                   help="memory for fleet work on this node (default: half of total memory)")
    g.add_argument("--mem-soft-floor", default="12%", metavar="FRACTION",
                   help="below this much available memory idle yieldable services stop "
                        "(0.12 or 12%%; default 12%%)")
    g.add_argument("--mem-hard-floor", default="8%", metavar="FRACTION",
                   help="below this one job or yieldable service is stopped per sample "
                        "(default 8%%)")
    g.add_argument("--mem-recover-margin", default="3%", metavar="FRACTION",
                   help="pressure ends this far above the soft floor (default 3%%)")
    g.add_argument("--mem-sample-s", type=float, default=DEFAULT_SAMPLE_S, metavar="S",
                   help="memory sample period in seconds (default 2)")
    g.add_argument("--gpu-apis", metavar="LIST",
                   help="GPU APIs this host provides, replacing detection "
                        f"(comma-separated from {', '.join(gpuapis.GPU_APIS)}, or none)")


def config_from_args(args: argparse.Namespace) -> tuple[GuardConfig, gpuapis.Detection | None]:
    """The guard's config and the GPU override from ``run``'s options. Raises ValueError
    with a message naming the option."""
    floors = Floors(soft=parse_fraction(args.mem_soft_floor, "--mem-soft-floor"),
                    hard=parse_fraction(args.mem_hard_floor, "--mem-hard-floor"),
                    recover_margin=parse_fraction(args.mem_recover_margin,
                                                  "--mem-recover-margin"))
    if not args.mem_sample_s > 0:
        raise ValueError(f"--mem-sample-s must be > 0 (got {args.mem_sample_s:g})")
    if args.memory_budget_gb is not None and not args.memory_budget_gb > 0:
        raise ValueError(f"--memory-budget-gb must be > 0 (got {args.memory_budget_gb:g})")
    gpu = None
    if args.gpu_apis is not None:
        try:
            gpu = gpuapis.from_override(args.gpu_apis)
        except ValueError as exc:
            raise ValueError(f"--gpu-apis: {exc}") from None
    return GuardConfig(floors, args.mem_sample_s, args.memory_budget_gb), gpu


def add_protect_parser(sub: Any) -> None:
    """``sub``: the command line's subparsers (``add_subparsers``)."""
    p = sub.add_parser("protect", help="set a host rule on a running agent (GPU work, evict)")
    p.add_argument("--state-dir", required=True, type=Path)
    rule = p.add_mutually_exclusive_group()
    for name, text in (("forbid-gpu", "no GPU work: GPU jobs held, yieldable GPU services "
                                      "stopped (preempt_protection)"),
                       ("allow-gpu", "GPU work allowed again"),
                       ("evict", "stop every yieldable service and keep it down "
                                 "(preempt_protection) until --end-evict"),
                       ("end-evict", "lift an eviction")):
        rule.add_argument(f"--{name}", dest="rule", action="store_const", const=name, help=text)


def cmd_protect(args: argparse.Namespace) -> int:
    req: dict[str, object] = {"op": "protect"}
    if args.rule:
        req["rule"] = args.rule
    try:
        reply = control.request(args.state_dir, req)
    except control.AgentNotRunning as exc:
        print(f"oarbank-agent: {exc}", file=sys.stderr)
        return 1
    except PermissionError:
        print(f"oarbank-agent: {not_permitted(args.state_dir)}", file=sys.stderr)
        return EXIT_NOT_PERMITTED
    except (OSError, ValueError) as exc:
        print(f"oarbank-agent: lost the agent: {exc}", file=sys.stderr)
        return 1
    if not reply.get("ok"):
        print(f"oarbank-agent: {reply.get('error', 'protect refused')}", file=sys.stderr)
        return 2 if reply.get("code") == "bad_request" else 1
    print(json.dumps({"rules": reply["rules"], "held": reply["held"]}))
    return 0
