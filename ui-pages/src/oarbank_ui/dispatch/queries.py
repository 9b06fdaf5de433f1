"""The ``jobs`` and ``attempts`` host queries (contract 10.8): a module's dispatch rows, newest
first, read from the dispatcher's tables (``store.py`` writes them)."""

from __future__ import annotations

from typing import Any

from ..queries.services import QueryError
from .jobview import job_view

__all__ = ["QUERY_PARAMS", "attempts_rows", "host_query", "jobs_rows"]

# the jobs and attempts host queries' parameters (contract 10.8)
QUERY_PARAMS = {"jobs": ("state", "stage", "node_id", "job_id"),
                "attempts": ("job_id", "node_id", "state")}


def host_query(backend: Any, name: str, modules: list[str], params: dict[str, Any],
               limit: int) -> list[dict[str, Any]]:
    """The ``jobs`` or ``attempts`` host query (contract 10.8): the module's rows, newest
    first, at most ``limit``; ``QueryError`` names a parameter it does not take."""
    known = QUERY_PARAMS[name]
    for k, v in params.items():
        if k not in known:
            raise QueryError(f"{name}: unknown parameter {k!r} ({', '.join(known)})")
        if not isinstance(v, str):
            raise QueryError(f"{name}: parameter {k} must be a string")
    if not modules:
        return []
    rows = (jobs_rows if name == "jobs" else attempts_rows)(backend, modules, params, limit)
    return rows

def jobs_rows(backend: Any, modules: list[str], params: dict[str, Any],
              limit: int) -> list[dict[str, Any]]:
    """The ``jobs`` host query's rows (contract 10.8)."""
    where, args = _filter(modules, params, ("state", "stage", "node_id", "job_id"))
    with backend.read(snapshot=False) as tx:
        rows = tx.all(f"SELECT * FROM jobs WHERE {where} ORDER BY seq DESC LIMIT ?",
                      [*args, limit])
    return [{k: v for k, v in job_view(r, full=False).items()
             if k not in ("attempt_id", "generation", "expires_at")}
            | {"submitter": r["submitter"]} for r in rows]

def attempts_rows(backend: Any, modules: list[str], params: dict[str, Any],
                  limit: int) -> list[dict[str, Any]]:
    where, args = _filter(modules, params, ("job_id", "node_id", "state"))
    with backend.read(snapshot=False) as tx:
        return tx.all("SELECT attempt_id, job_id, generation, node_id, stage, placement,"
                      f" state, issued_at, expires_at, ended_at FROM attempts WHERE {where}"
                      " ORDER BY attempt_id DESC LIMIT ?", [*args, limit])

def _filter(modules: list[str], params: dict[str, Any],
            known: tuple[str, ...]) -> tuple[str, list[Any]]:
    where = f"module IN ({', '.join('?' * len(modules))})"
    args: list[Any] = list(modules)
    for k in known:
        if k in params:
            where += f" AND {k} = ?"
            args.append(params[k])
    return where, args
