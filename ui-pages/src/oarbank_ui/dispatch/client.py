"""``oarbank-portal jobs``: a submitter's side of fleet dispatch, over HTTP (contract 10.2, 10.3).

  jobs submit --portal URL --token-file FILE --module M --stage S --file payloads.jsonl
              [--wait] [--out results.jsonl]
  jobs status --portal URL --token-file FILE (JOB_ID ... | --batch BATCH_ID ...)
  jobs cancel --portal URL --token-file FILE (JOB_ID ... | --batch BATCH_ID ...)

``submit`` sends one payload per line (a JSON object; blank lines hold nothing), 10,000 to a
request, each request with an idempotency key of this run: a request retried after a lost
answer or a 503 never makes a second job. It prints each job's id and batch (a JSON line each).
With ``--wait`` it shows progress (rich: done, failed, running, by node) until every job has
ended, writes each final record to ``--out`` (one JSON line per job, in file order), and exits 0
only when every job succeeded (1 otherwise; 2 for bad arguments, refusals and an unreachable
portal).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote, urlencode

from .protocol import MAX_BATCH

__all__ = ["add_parser", "main"]

RETRY_FOR_S = 120.0  # how long a request is retried while the portal answers 503 or is away


class ClientError(Exception):
    """What to tell the user before exiting 2."""


def add_parser(sub: Any) -> None:
    j = sub.add_parser("jobs", help="submit jobs to the portal, follow them, cancel them")
    jsub = j.add_subparsers(dest="jobs_cmd", required=True)
    s = jsub.add_parser("submit", help="submit one job per line of a JSONL file of payloads")
    _common(s)
    s.add_argument("--module", required=True, help="the module's id or short name")
    s.add_argument("--stage", required=True, help="the stage every job runs")
    s.add_argument("--file", required=True, metavar="payloads.jsonl",
                   help="one payload (a JSON object) per line; - reads stdin")
    s.add_argument("--wait", action="store_true",
                   help="follow the jobs to their end; exit 0 only if every one succeeded")
    s.add_argument("--out", metavar="results.jsonl",
                   help="with --wait: each job's final record, one JSON line per job")
    s.add_argument("--poll-s", type=float, default=1.0, help="how often --wait asks (default 1)")
    for name, what in (("status", "print jobs' records, or batches' counts"),
                       ("cancel", "cancel jobs, or what of a batch has not ended")):
        x = jsub.add_parser(name, help=what)
        _common(x)
        x.add_argument("job_ids", nargs="*", metavar="JOB_ID")
        x.add_argument("--batch", action="append", default=[], metavar="BATCH_ID",
                       help="a batch a submit printed (repeatable)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--portal", required=True, metavar="URL", help="the portal, http(s)://host:port")
    p.add_argument("--token-file", required=True, metavar="FILE",
                   help="the submitter token (`oarbank-portal token issue --submitter NAME`)")


class Portal:
    def __init__(self, url: str, token: str, *, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def call(self, method: str, path: str, doc: Any = None) -> tuple[int, Any, dict[str, str]]:
        """(status, document, headers); 503 and connection failures are retried for a while,
        with the same body (the portal's idempotency makes that safe)."""
        data = None if doc is None else json.dumps(doc).encode()
        if method == "POST" and data is None:
            data = b"{}"
        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            req = urllib.request.Request(self.url + path, data=data, method=method, headers={
                "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    return r.status, json.loads(r.read() or b"null"), dict(r.headers)
            except urllib.error.HTTPError as e:
                body = e.read()
                try:
                    got = json.loads(body or b"null")
                except json.JSONDecodeError:
                    got = {"error": "http", "detail": body.decode("utf-8", "replace")[:200]}
                if e.code != 503 or time.monotonic() > deadline:
                    return e.code, got, dict(e.headers)
                wait = float(e.headers.get("Retry-After") or 1)
            except (urllib.error.URLError, OSError) as e:
                if time.monotonic() > deadline:
                    raise ClientError(f"cannot reach the portal at {self.url}: {e}") from None
                wait = 1.0
            time.sleep(min(wait, max(0.1, deadline - time.monotonic())))


def _refusal(status: int, doc: Any) -> str:
    if isinstance(doc, dict):
        where = f" ({doc['field']})" if doc.get("field") else ""
        return f"{status} {doc.get('error')}{where}: {doc.get('detail', '')}"
    return f"{status}: {doc}"


def _payloads(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        f: TextIO = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    except OSError as e:
        raise ClientError(f"--file: {e}") from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise ClientError(f"{path}:{n}: not JSON ({e})") from None
            if not isinstance(doc, dict):
                raise ClientError(f"{path}:{n}: a payload is a JSON object, got "
                                  f"{type(doc).__name__}")
            yield n, doc


def _submit(portal: Portal, args: argparse.Namespace) -> int:
    if args.out and not args.wait:
        raise ClientError("--out needs --wait (the records are final only then)")
    payloads = list(_payloads(args.file))
    if not payloads:
        raise ClientError(f"{args.file}: no payloads")
    run = secrets.token_hex(8)  # this run's keys: a retried request never makes a second job
    batches: list[str] = []
    jobs: list[str] = []
    for i in range(0, len(payloads), MAX_BATCH):
        chunk = payloads[i:i + MAX_BATCH]
        body = {"jobs": [{"module": args.module, "stage": args.stage, "payload": p}
                         for _n, p in chunk], "idempotency_key": f"{run}#{i // MAX_BATCH}"}
        status, doc, _h = portal.call("POST", "/v1/jobs", body)
        if status not in (200, 201):
            field = doc.get("field", "") if isinstance(doc, dict) else ""
            if field.startswith("jobs["):  # name the line, not the batch index
                k = int(field[5:field.index("]")])
                raise ClientError(f"{args.file}:{chunk[k][0]}: refused: "
                                  + _refusal(status, doc))
            raise ClientError("submit refused: " + _refusal(status, doc))
        batches.append(doc["batch_id"])
        for j in doc["jobs"]:
            jobs.append(j["job_id"])
            print(json.dumps({"job_id": j["job_id"], "batch_id": doc["batch_id"]}), flush=True)
    print(f"oarbank-portal: {len(jobs)} jobs submitted in {len(batches)} "
          f"batch{'es' if len(batches) > 1 else ''}", file=sys.stderr)
    if not args.wait:
        return 0
    counts = _follow(portal, batches, args.poll_s)
    if args.out:
        _write_records(portal, batches, Path(args.out))
    ok = counts["succeeded"] == len(jobs)
    print(f"oarbank-portal: {counts['succeeded']} succeeded, {counts['failed']} failed, "
          f"{counts['cancelled']} cancelled of {len(jobs)}", file=sys.stderr)
    return 0 if ok else 1


def _counts(portal: Portal, batches: list[str]) -> tuple[dict[str, int],
                                                          dict[str, dict[str, int]]]:
    states: dict[str, int] = {}
    nodes: dict[str, dict[str, int]] = {}
    for b in batches:
        status, doc, _h = portal.call("GET", f"/v1/batches/{quote(b, safe='')}")
        if status != 200:
            raise ClientError(f"batch {b}: " + _refusal(status, doc))
        for k, v in doc["states"].items():
            states[k] = states.get(k, 0) + v
        for node, per in doc["nodes"].items():
            mine = nodes.setdefault(node, {"running": 0, "succeeded": 0, "failed": 0})
            for k, v in per.items():
                mine[k] = mine.get(k, 0) + v
    return states, nodes


def _follow(portal: Portal, batches: list[str], poll_s: float) -> dict[str, int]:
    """Progress until no job of the batches is queued or running: rich's bars on stderr, one
    for all jobs and one per node."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[detail]}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bars:
        states, nodes = _counts(portal, batches)
        total = sum(states.values())
        overall = bars.add_task("all jobs", total=total, detail="")
        per_node: dict[str, Any] = {}
        while True:
            ended = states["succeeded"] + states["failed"] + states["cancelled"]
            bars.update(overall, completed=ended, detail=(
                f"done {states['succeeded']}  failed {states['failed']}  running "
                f"{states['running']}  queued {states['queued']}"
                + (f"  cancelled {states['cancelled']}" if states["cancelled"] else "")))
            for node, per in sorted(nodes.items()):
                if node not in per_node:
                    per_node[node] = bars.add_task(node, total=total, detail="")
                bars.update(per_node[node], completed=per["succeeded"] + per["failed"],
                            detail=f"done {per['succeeded']}  failed {per['failed']}  "
                                   f"running {per['running']}")
            if states["queued"] + states["running"] == 0:
                return states
            time.sleep(poll_s)
            states, nodes = _counts(portal, batches)


def _write_records(portal: Portal, batches: list[str], out: Path) -> None:
    with out.open("w", encoding="utf-8") as f:
        for b in batches:
            path: str | None = "/v1/jobs?" + urlencode({"batch": b})
            while path is not None:
                status, page, headers = portal.call("GET", path)
                if status != 200:
                    raise ClientError(f"batch {b}: " + _refusal(status, page))
                for rec in page:
                    f.write(json.dumps(rec) + "\n")
                link = headers.get("Link") or headers.get("link")
                path = link[1:link.index(">")] if link else None


def _each(portal: Portal, args: argparse.Namespace) -> int:
    if not args.job_ids and not args.batch:
        raise ClientError(f"jobs {args.jobs_cmd}: give JOB_IDs or --batch BATCH_ID")
    worst = 0
    for b in args.batch:
        q = quote(b, safe="")
        status, doc, _h = (portal.call("GET", f"/v1/batches/{q}") if args.jobs_cmd == "status"
                           else portal.call("POST", f"/v1/batches/{q}/cancel"))
        print(json.dumps(doc if status == 200 else {"batch_id": b, **doc}))
        worst = max(worst, 0 if status == 200 else 1)
    for job_id in args.job_ids:
        q = quote(job_id, safe="")
        status, doc, _h = (portal.call("GET", f"/v1/jobs/{q}") if args.jobs_cmd == "status"
                           else portal.call("POST", f"/v1/jobs/{q}/cancel"))
        print(json.dumps(doc if status == 200 else {"job_id": job_id, **doc}))
        if status != 200:
            print(f"oarbank-portal: job {job_id}: {_refusal(status, doc)}", file=sys.stderr)
            worst = 1
    return worst


def main(args: argparse.Namespace) -> int:
    try:
        token = Path(args.token_file).read_text(encoding="utf-8").strip()
    except OSError as e:
        print(f"oarbank-portal: --token-file: {e}", file=sys.stderr)
        return 2
    if not token:
        print(f"oarbank-portal: --token-file {args.token_file} is empty", file=sys.stderr)
        return 2
    portal = Portal(args.portal, token)
    try:
        if args.jobs_cmd == "submit":
            return _submit(portal, args)
        return _each(portal, args)
    except ClientError as e:
        print(f"oarbank-portal: {e}", file=sys.stderr)
        return 2
