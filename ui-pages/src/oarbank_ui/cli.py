"""``oarbank-portal``: serve the portal, or preview a module's pages from its fixtures.

  oarbank-portal serve --db FILE --module DIR [--module DIR ...]
                       [--listen 127.0.0.1:PORT | --unix PATH] [--refresh-s S]
  oarbank-portal preview MODULE_DIR [--out DIR] [--node NODE_ID]

``serve`` prints one line ``oarbank-portal: serving on <url>`` once it accepts requests (with
``--listen HOST:0`` the url carries the port it got). Exit 2 on bad arguments or an invalid
module, 0 on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from oarbank_sdk.manifest import ManifestError

from .app import Portal
from .modules import load_modules
from .preview import write_preview
from .server import make_server
from .store import HeartbeatStore

__all__ = ["main"]

DEFAULT_LISTEN = "127.0.0.1:8470"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oarbank-portal", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="heartbeats in, the services query and pages out")
    s.add_argument("--db", required=True, help="SQLite file for heartbeats (created if absent)")
    s.add_argument("--module", action="append", default=[], metavar="MODULE_DIR",
                   help="a module folder whose pages to serve (repeatable)")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--listen", metavar="HOST:PORT",
                       help=f"TCP address (default {DEFAULT_LISTEN}; port 0 = any free port)")
    where.add_argument("--unix", metavar="PATH", help="serve on a unix socket at PATH instead")
    s.add_argument("--refresh-s", type=float, default=3.0,
                   help="how often pages refresh their data (default 3)")
    s.add_argument("-v", "--verbose", action="store_true", help="log every request")
    v = sub.add_parser("preview", help="render a module's pages from fixtures/ui/queries/*.json")
    v.add_argument("module_dir", metavar="MODULE_DIR")
    v.add_argument("--out", default="oarbank-preview",
                   help="folder for the HTML (default ./oarbank-preview)")
    v.add_argument("--node", help="node id panels show ($node); default: the first node_id "
                                  "in the fixtures")
    return p


def _serve(args: argparse.Namespace) -> int:
    if args.refresh_s <= 0:
        print("oarbank-portal: --refresh-s must be > 0", file=sys.stderr)
        return 2
    try:
        modules = load_modules(args.module)
    except (ManifestError, ValueError) as e:
        print(f"oarbank-portal: {e}", file=sys.stderr)
        return 2
    try:
        store = HeartbeatStore(args.db)
    except Exception as e:
        print(f"oarbank-portal: cannot open the heartbeat store {args.db}: {e}", file=sys.stderr)
        return 2
    portal = Portal(store, modules, refresh_s=args.refresh_s)
    try:
        server = make_server(portal, listen=None if args.unix else (args.listen or DEFAULT_LISTEN),
                             unix=args.unix)
    except (OSError, ValueError) as e:
        print(f"oarbank-portal: cannot serve: {e}", file=sys.stderr)
        store.close()
        return 2

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"oarbank-portal: serving on {server.url}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        store.close()
    return 0


def _preview(args: argparse.Namespace) -> int:
    try:
        written = write_preview(Path(args.module_dir), Path(args.out), node=args.node)
    except ManifestError as e:
        print(f"oarbank-portal: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.cmd == "serve":
        return _serve(args)
    return _preview(args)


if __name__ == "__main__":
    sys.exit(main())
