"""Versioned schema migrations, shipped in the package: ``migrations/<store>/NNNN_name.sql``.

Both stores carry the same version numbers (a change lands in both folders under one number),
and ``schema_migrations`` in each database records what was applied. A store opens with every
pending migration applied in order, each in its own transaction; a database newer than this
portal (a version it has no file for) is refused rather than written with an older schema.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from importlib import resources

__all__ = ["Migration", "MigrationError", "available", "check_applied", "statements"]

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationError(RuntimeError):
    """The database's schema cannot be brought to this portal's (the message says why)."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available(kind: str) -> list[Migration]:
    """The migrations of one store kind (``sqlite`` or ``postgresql``), in version order."""
    folder = resources.files("oarbank_ui.store").joinpath("migrations", kind)
    found = []
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda x: x.version)
    if [x.version for x in found] != list(range(1, len(found) + 1)):
        raise MigrationError(f"migrations/{kind}: versions must run 1, 2, 3 ... without gaps")
    return found


def check_applied(kind: str, applied: set[int], where: str) -> list[Migration]:
    """The pending migrations; refuses a database that is ahead of this portal."""
    known = available(kind)
    newest = known[-1].version if known else 0
    ahead = sorted(v for v in applied if v > newest)
    if ahead:
        raise MigrationError(f"{where}: schema version {ahead[-1]} is newer than this portal "
                             f"knows (up to {newest}); upgrade oarbank-ui before serving it")
    return [m for m in known if m.version not in applied]


def statements(sql: str) -> list[str]:
    """One SQL script as separate statements (SQLite's executescript would commit the
    transaction a migration must run in)."""
    out, buf = [], ""
    for line in sql.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip() and not all(ln.strip().startswith("--") or not ln.strip()
                               for ln in buf.splitlines()):
        raise MigrationError(f"unterminated SQL statement: {buf.strip()[:80]!r}")
    return out
