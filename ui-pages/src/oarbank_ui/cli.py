"""``oarbank-portal``: serve the portal, manage node credentials, or preview a module's pages.

  oarbank-portal serve --db FILE|postgresql://... --module DIR [--module DIR ...]
                       [--listen 127.0.0.1:PORT | --unix PATH] [--refresh-s S]
                       [--allowed-host NAME ...] [--tls-cert PEM --tls-key PEM]
  oarbank-portal token issue|revoke NODE_ID --db ...   |   token list --db ...
  oarbank-portal node remove NODE_ID --db ...
  oarbank-portal preview MODULE_DIR [--out DIR] [--node NODE_ID]
  oarbank-portal token issue|revoke --submitter NAME --db ...
  oarbank-portal jobs submit|status|cancel --portal URL --token-file FILE ...

``serve`` prints one line ``oarbank-portal: serving on <url>`` once it accepts requests (with
``--listen HOST:0`` the url carries the port it got). Exit 2 on bad arguments, an invalid
module or a store it cannot open, 0 on SIGTERM/SIGINT. ``--db`` may come from
``OARBANK_PORTAL_DB`` instead (a PostgreSQL URL with a password stays out of ``ps``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from oarbank_sdk.manifest import ManifestError

from .store.group_commit import DEFAULT_LINGER_S
from .store.heartbeats import HeartbeatStore, is_postgres_url, open_store
from .store.history import History

__all__ = ["main"]

DEFAULT_LISTEN = "127.0.0.1:8470"
DEFAULT_LINGER_MS = DEFAULT_LINGER_S * 1000


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oarbank-portal", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="heartbeats in, the services query and pages out")
    _db_arg(s)
    s.add_argument("--module", action="append", default=[], metavar="MODULE_DIR",
                   help="a module folder whose pages to serve (repeatable)")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--listen", metavar="HOST:PORT",
                       help=f"TCP address (default {DEFAULT_LISTEN}; port 0 = any free port)")
    where.add_argument("--unix", metavar="PATH", help="serve on a unix socket at PATH instead")
    s.add_argument("--refresh-s", type=float, default=3.0,
                   help="how often pages refresh their data (default 3)")
    s.add_argument("--allowed-host", action="append", default=[], metavar="NAME[:PORT]",
                   help="a Host the portal answers (repeatable; default: the listen address, "
                        "localhost and 127.0.0.1 on its port; '*': any, behind a proxy that "
                        "checks)")
    s.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate chain")
    s.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    s.add_argument("--read-timeout-s", type=float, default=10.0, metavar="S",
                   help="a request body must arrive within S seconds (default 10)")
    s.add_argument("--max-connections", type=int, default=1000, metavar="N",
                   help="open connections beyond N are answered 503 (default 1000)")
    s.add_argument("--workers", type=int, default=1, metavar="N",
                   help="serve from N processes on one socket (a portal is CPU-bound: one "
                        "process uses one core; default 1)")
    s.add_argument("--pool-size", type=int, default=10, metavar="N",
                   help="store connections at most (PostgreSQL), and requests handled at once "
                        "per worker (default 10)")
    s.add_argument("--metrics-retention-h", type=float, default=168.0, metavar="H",
                   help="hours of node metrics history kept for node_metrics (default 168: "
                        "a week; 5-minute samples for 6 hours, then hourly)")
    s.add_argument("--ingest-bound-s", type=float, default=1.0, metavar="S",
                   help="no heartbeat waits longer than S seconds for its answer: past half of "
                        "it reports are refused 503 with Retry-After (default 1)")
    s.add_argument("--ingest-linger-ms", type=float, default=None, metavar="MS",
                   help="a heartbeat waits up to MS milliseconds for others to share its "
                        f"commit, while they arrive that often (default {DEFAULT_LINGER_MS:g}, "
                        "or a twentieth of --ingest-bound-s if that is less; 0: never waits)")
    s.add_argument("--retry-after-s", type=int, default=10, metavar="S",
                   help="the Retry-After of a refused heartbeat (default 10: a period)")
    s.add_argument("--placement", choices=("warm-aware", "warm-blind"), default="warm-aware",
                   help="how claims are granted: warm-aware (default: a job goes where its "
                        "model is warm) or warm-blind (first come, first served)")
    s.add_argument("--lease-s", type=float, default=60.0, metavar="S",
                   help="a granted job's lease, renewed by its node (default 60)")
    s.add_argument("--results-retention-h", type=float, default=168.0, metavar="H",
                   help="hours a finished job and its result are kept (default 168)")
    s.add_argument("-v", "--verbose", action="store_true", help="log every request")
    t = sub.add_parser("token", help="node credentials: issue, list, revoke")
    tsub = t.add_subparsers(dest="token_cmd", required=True)
    for name, what in (("issue", "print a new token for NODE_ID, or for a submitter (once; "
                                 "only its hash is kept)"),
                       ("revoke", "NODE_ID's reports (or the submitter's requests) are refused "
                                  "from now on")):
        x = tsub.add_parser(name, help=what)
        x.add_argument("node_id", metavar="NODE_ID", nargs="?")
        x.add_argument("--submitter", metavar="NAME",
                       help="a submitter's token (POST /v1/jobs and the jobs commands) instead "
                            "of a node's")
        _db_arg(x)
    _db_arg(tsub.add_parser("list", help="nodes and submitters holding a token, and when it "
                                         "was issued"))
    n = sub.add_parser("node", help="nodes: remove")
    nsub = n.add_subparsers(dest="node_cmd", required=True)
    x = nsub.add_parser("remove", help="forget NODE_ID: its report, its rows and its token")
    x.add_argument("node_id", metavar="NODE_ID")
    _db_arg(x)
    from .dispatch.client import add_parser as add_jobs

    add_jobs(sub)
    v = sub.add_parser("preview", help="render a module's pages from fixtures/ui/queries/*.json")
    v.add_argument("module_dir", metavar="MODULE_DIR")
    v.add_argument("--out", default="oarbank-preview",
                   help="folder for the HTML (default ./oarbank-preview)")
    v.add_argument("--node", help="node id panels show ($node); default: the first node_id "
                                  "in the fixtures")
    return p


def _db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=os.environ.get("OARBANK_PORTAL_DB"),
                   metavar="FILE|postgresql://...",
                   help="the heartbeat store: an SQLite file (created 0600 if absent) or a "
                        "PostgreSQL URL (default: $OARBANK_PORTAL_DB)")


def _fail(message: str) -> int:
    print(f"oarbank-portal: {message}", file=sys.stderr)
    return 2


def _history(args: argparse.Namespace) -> History:
    hours = getattr(args, "metrics_retention_h", None)
    return History() if hours is None else History(retention_s=int(hours * 3600))


def _open(args: argparse.Namespace, **pool: Any) -> HeartbeatStore | None:
    if not args.db:
        _fail("--db is required (an SQLite file or a postgresql:// URL)")
        return None
    shown = args.db
    if is_postgres_url(args.db):
        from .store.postgres import redact

        shown = redact(args.db)
    try:
        return open_store(args.db, history=_history(args),
                          **(pool if is_postgres_url(args.db) else {}))
    except Exception as e:
        _fail(f"cannot open the heartbeat store {shown}: {e}")
        return None


def _serve(args: argparse.Namespace) -> int:
    if not 1 <= args.metrics_retention_h <= 24 * 366:
        return _fail(f"--metrics-retention-h: from 1 to {24 * 366} hours, "
                     f"got {args.metrics_retention_h:g}")
    if args.workers < 1:
        return _fail("--workers must be >= 1")
    if args.workers > 1 and not hasattr(os, "fork"):
        return _fail("--workers needs fork (POSIX); run one portal per port instead")
    metrics_dir = None
    if args.workers > 1:
        import tempfile

        # before prometheus_client is imported (web/prometheus.py): its values go to shared files
        metrics_dir = tempfile.mkdtemp(prefix="oarbank-portal-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        return _serve_in(args)
    finally:
        if metrics_dir is not None:
            import shutil

            shutil.rmtree(metrics_dir, ignore_errors=True)


def _serve_in(args: argparse.Namespace) -> int:
    # Imported here: `token` and `node` need neither the web stack nor the page renderer.
    from .pages.modules import load_modules
    from .web.app import Portal
    from .web.server import ServeOptions, bind, serve, serve_workers

    if args.refresh_s <= 0:
        return _fail("--refresh-s must be > 0")
    if args.ingest_bound_s <= 0 or args.retry_after_s < 1:
        return _fail("--ingest-bound-s must be > 0 and --retry-after-s >= 1")
    if args.ingest_linger_ms is None:  # a shorter bound set alone brings the linger down
        args.ingest_linger_ms = min(DEFAULT_LINGER_MS, args.ingest_bound_s * 1000 / 20)
    if not 0 <= args.ingest_linger_ms < args.ingest_bound_s * 1000 * 0.1:
        return _fail(f"--ingest-linger-ms must be >= 0 and under a tenth of --ingest-bound-s "
                     f"({args.ingest_bound_s * 100:g} ms), got {args.ingest_linger_ms:g}")
    if args.lease_s < 1 or args.results_retention_h <= 0:
        return _fail("--lease-s must be >= 1 and --results-retention-h > 0")
    if args.read_timeout_s <= 0 or args.max_connections < 1 or args.pool_size < 1:
        return _fail("--read-timeout-s, --max-connections and --pool-size must be > 0")
    if bool(args.tls_cert) != bool(args.tls_key):
        return _fail("--tls-cert and --tls-key go together")
    if args.tls_cert and args.unix:
        return _fail("TLS is for --listen; a unix socket is guarded by its file mode")
    try:
        modules = load_modules(args.module)
    except (ManifestError, ValueError) as e:
        return _fail(str(e))
    opts = ServeOptions(listen=None if args.unix else (args.listen or DEFAULT_LISTEN),
                        unix=args.unix, tls_cert=args.tls_cert, tls_key=args.tls_key,
                        allowed_hosts=args.allowed_host, read_timeout_s=args.read_timeout_s,
                        max_connections=args.max_connections, verbose=args.verbose,
                        threads=args.pool_size)
    pool = {"max_size": args.pool_size, "min_size": min(2, args.pool_size)}
    store = _open(args, **pool)  # here, once: a store that cannot be opened fails the start
    if store is None:
        return 2
    try:
        try:
            bound = bind(opts)
        except (OSError, ValueError) as e:
            return _fail(f"cannot serve: {e}")
        if args.workers > 1:
            store.close()  # connections do not survive a fork: each worker opens its own

            def make_portal() -> Portal:
                own = open_store(args.db, history=_history(args),
                                 **(pool if is_postgres_url(args.db) else {}))
                return _with_ingest(Portal(own, modules, refresh_s=args.refresh_s,
                                           allowed_hosts=bound.hosts,
                                           dispatch=_dispatch_options(args)), args)

            return serve_workers(make_portal, bound, opts, args.workers)
        portal = _with_ingest(Portal(store, modules, refresh_s=args.refresh_s,
                                     allowed_hosts=bound.hosts,
                                     dispatch=_dispatch_options(args)), args)
        try:
            serve(portal, bound, opts)
        except (OSError, ValueError) as e:  # e.g. a TLS file that cannot be read
            return _fail(f"cannot serve: {e}")
        finally:
            portal.close()
    finally:
        store.close()
    return 0


def _dispatch_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"mode": args.placement, "lease_s": args.lease_s,
            "retention_s": args.results_retention_h * 3600}


def _with_ingest(portal: Any, args: argparse.Namespace) -> Any:
    portal.ingest_options = {"bound_s": args.ingest_bound_s, "retry_after_s": args.retry_after_s,
                             "linger_s": args.ingest_linger_ms / 1000}
    return portal


def _bad_node_id(node_id: str) -> str | None:
    """Why ``node_id`` cannot be a node's (a heartbeat's node_id is a non-empty string)."""
    if not node_id or node_id != node_id.strip() or not node_id.isprintable():
        return f"node id {node_id!r}: must be non-empty printable text without surrounding spaces"
    if len(node_id) > 4096:
        return "node id: longer than 4096 characters"
    return None


def _token(args: argparse.Namespace) -> int:
    if args.token_cmd != "list":
        if (args.node_id is None) == (args.submitter is None):
            return _fail(f"token {args.token_cmd}: give NODE_ID or --submitter NAME (one)")
        if (why := _bad_node_id(args.node_id if args.submitter is None else args.submitter)):
            return _fail(why.replace("node id", "submitter") if args.submitter else why)
    store = _open(args, min_size=1, max_size=1)
    if store is None:
        return 2
    try:
        if args.token_cmd != "list" and args.submitter is not None:
            return _submitter_token(store, args.token_cmd, args.submitter)
        if args.token_cmd == "issue":
            token, replaced = store.issue_token(args.node_id)
            print(token)
            print(f"oarbank-portal: token for node {args.node_id} issued"
                  + (" (its previous token no longer works)" if replaced else "")
                  + "; it is shown only now: write it to the node's --portal-token-file "
                    "(mode 0600)", file=sys.stderr)
        elif args.token_cmd == "revoke":
            if not store.revoke_token(args.node_id):
                return _fail(f"node {args.node_id} holds no token")
            print(f"oarbank-portal: token of node {args.node_id} revoked", file=sys.stderr)
        else:
            import time

            from .dispatch.store import DispatchStore

            for t in store.tokens():
                when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t["issued_at"]))
                print(f"{t['node_id']}\tissued {when}")
            for t in DispatchStore(store.backend).submitters():
                when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t["issued_at"]))
                print(f"submitter {t['name']}\tissued {when}")
    finally:
        store.close()
    return 0


def _submitter_token(store: HeartbeatStore, cmd: str, name: str) -> int:
    from .dispatch.store import DispatchStore

    jobs = DispatchStore(store.backend)
    if cmd == "issue":
        token, replaced = jobs.issue_submitter(name)
        print(token)
        print(f"oarbank-portal: token for submitter {name} issued"
              + (" (its previous token no longer works)" if replaced else "")
              + "; it is shown only now: keep it in a file of mode 0600 (jobs --token-file)",
              file=sys.stderr)
        return 0
    if not jobs.revoke_submitter(name):
        return _fail(f"submitter {name} holds no token")
    print(f"oarbank-portal: token of submitter {name} revoked", file=sys.stderr)
    return 0


def _node(args: argparse.Namespace) -> int:
    store = _open(args, min_size=1, max_size=1)
    if store is None:
        return 2
    try:
        gone = store.remove_node(args.node_id)
    finally:
        store.close()
    if not any(gone.values()):
        return _fail(f"no node {args.node_id} (no report, no token)")
    print(f"oarbank-portal: node {args.node_id} removed ({gone['rows']} service rows"
          f"{', its token' if gone['tokens'] else ''})", file=sys.stderr)
    return 0


def _preview(args: argparse.Namespace) -> int:
    from .pages.preview import write_preview

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
    if args.cmd == "token":
        return _token(args)
    if args.cmd == "node":
        return _node(args)
    if args.cmd == "jobs":
        from .dispatch.client import main as jobs_main

        return jobs_main(args)
    return _preview(args)


if __name__ == "__main__":
    sys.exit(main())
