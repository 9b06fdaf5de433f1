"""The agent's own log: where it goes (stderr, or a file rotated by size), its level, and its
format (``text``, or ``json``: one object per line an operator's log shipper can index).

Levels are a promise to the operator: INFO for what a healthy node does (a service started,
stopped when idle, a job finished), WARNING only for what someone should look at (a service
that failed, a portal refusing the node, a stop that had to be escalated).

A JSON line is ``{"time", "level", "event", "module", "service", "job", "attempt", "logger"}``
(plus ``"error"`` with the traceback of a ``log.exception``). ``module`` .. ``attempt`` come from
the record's ``extra`` when the caller gave them (``fields``), else from the message's usual
prefixes (``<module>/<service>: ...``, ``job <id>``, ``attempt=<job id>.<n>``), else null.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import re
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["LEVELS", "FORMATS", "LogOptions", "configure", "fields", "JsonFormatter",
           "TEXT_FORMAT"]

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
DEFAULT_MAX_MB = 10.0
DEFAULT_BACKUPS = 5

# The record attributes ``fields`` sets. Not ``module``: LogRecord already has one (the
# Python module that logged).
_EXTRA = {"module": "oarbank_module", "service": "oarbank_service", "job": "oarbank_job",
          "attempt": "oarbank_attempt"}

# The prefixes the agent's messages already use, so every existing line gets its fields.
_ATTEMPT_RE = re.compile(r"\battempt=(?P<job>j[\w-]+)\.(?P<n>\d+)")
_JOB_RE = re.compile(r"\bjob (?P<job>j\d{14}-[\w-]+)")
_SERVICE_RE = re.compile(r"^(?:channel )?(?P<module>[A-Za-z0-9_.-]+)/(?P<service>[A-Za-z0-9_.-]+)"
                         r"(?:[: ]|$)")
_SERVICE_ANY_RE = re.compile(r"\bservice=(?P<module>[A-Za-z0-9_.-]+)/(?P<service>[A-Za-z0-9_.-]+)")


def fields(*, module: str | None = None, service: str | None = None, job: str | None = None,
           attempt: int | str | None = None, service_key: str | None = None) -> dict[str, Any]:
    """``extra=`` for a log call: the JSON line's fields (``service_key``: ``module/service``)."""
    if service_key is not None:
        module, _, service = service_key.partition("/")
    given = {"module": module, "service": service, "job": job, "attempt": attempt}
    return {_EXTRA[k]: v for k, v in given.items() if v is not None}


def _found(record: logging.LogRecord, message: str) -> dict[str, Any]:
    out: dict[str, Any] = {"module": None, "service": None, "job": None, "attempt": None}
    m = _ATTEMPT_RE.search(message)
    if m:
        out["job"], out["attempt"] = m["job"], int(m["n"])
    else:
        m = _JOB_RE.search(message)
        if m:
            out["job"] = m["job"]
    m = _SERVICE_RE.match(message) or _SERVICE_ANY_RE.search(message)
    if m:
        out["module"], out["service"] = m["module"], m["service"]
    for k, attr in _EXTRA.items():  # what the caller said beats what the text suggests
        if getattr(record, attr, None) is not None:
            out[k] = getattr(record, attr)
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line; never more than one line (newlines are escaped by json)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "event": message,
            **_found(record, message),
            "logger": record.name,
        }
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


class LogOptions:
    """What ``--log-file``, ``--log-level``, ``--log-format`` (and the config file) asked for."""

    def __init__(self, *, level: str = "info", fmt: str = "text", file: Path | None = None,
                 max_mb: float = DEFAULT_MAX_MB, backups: int = DEFAULT_BACKUPS) -> None:
        if level not in LEVELS:
            raise ValueError(f"--log-level {level!r}: expected one of {', '.join(LEVELS)}")
        if fmt not in FORMATS:
            raise ValueError(f"--log-format {fmt!r}: expected one of {', '.join(FORMATS)}")
        if not max_mb > 0:
            raise ValueError(f"--log-max-mb {max_mb!r}: must be > 0")
        if backups < 1:
            raise ValueError(f"--log-backups {backups!r}: must be >= 1")
        self.level, self.fmt, self.file = level, fmt, file
        self.max_mb, self.backups = max_mb, backups


def configure(opts: LogOptions | None = None) -> logging.Handler:
    """Route the ``oarbank_agent`` loggers (and the root's, for libraries) to one handler.

    Raises OSError when ``--log-file`` cannot be opened (the caller names the option)."""
    opts = opts or LogOptions()
    handler: logging.Handler
    if opts.file is not None:
        opts.file.parent.mkdir(parents=True, exist_ok=True)
        # Size rotation: the file never grows past max_mb; `backups` older ones are kept
        # (agent.log.1 .. .N), so a node's disk is never filled by the agent's own log.
        handler = logging.handlers.RotatingFileHandler(
            opts.file, maxBytes=int(opts.max_mb * 2**20), backupCount=opts.backups,
            encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if opts.fmt == "json" else
                         logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):  # a reconfigure (tests, reload) replaces, never doubles
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(getattr(logging, opts.level.upper()))
    return handler
