"""What each service costs to load and how much it is used: demand eviction's inputs
(``protection/eviction.py``), kept across the service's runs and the agent's restarts.

Per service key: ``load_s`` (start to ready, a moving mean: half the last load, half the
mean before), ``loads`` (how many were measured), ``uses`` (a use count decayed by age, as of
``last_used``) and ``last_used`` (unix time a user last came or went). Kept in
``<state>/service_stats.json``, written whole (temp file, rename) when a load is measured and
when a service stops: a cache, not a record; losing the last write costs one estimate, so it
is not fsynced. An unreadable file is said once and started afresh.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from oarbank_agent.platform import fileflags
from oarbank_agent.protection.eviction import decayed_uses

__all__ = ["LoadStats", "FILE_NAME"]

FILE_NAME = "service_stats.json"

log = logging.getLogger("oarbank_agent.services.supervisor")


class LoadStats:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE_NAME
        self._by_key: dict[str, dict[str, Any]] = {}
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("%s is unreadable (%s): load times are measured afresh", self.path, exc)
            return
        if isinstance(doc, dict):
            self._by_key = {k: v for k, v in doc.items() if isinstance(v, dict)}

    def _entry(self, key: str) -> dict[str, Any]:
        return self._by_key.setdefault(key, {"load_s": None, "loads": 0, "uses": 0.0,
                                             "last_used": None})

    def loaded(self, key: str, seconds: float) -> None:
        """A start of ``key`` took ``seconds`` to ready."""
        e = self._entry(key)
        before = e.get("load_s")
        e["load_s"] = round(seconds if not isinstance(before, (int, float))
                            else 0.5 * seconds + 0.5 * before, 4)
        e["loads"] = int(e.get("loads") or 0) + 1
        self.save()

    def used(self, key: str, now: float, *, arrived: bool) -> None:
        """A user came (``arrived``: one more use) or the last one left, at ``now``."""
        e = self._entry(key)
        e["uses"] = round(self.uses(key, now) + (1.0 if arrived else 0.0), 6)
        e["last_used"] = now

    def load_s(self, key: str) -> float | None:
        v = self._by_key.get(key, {}).get("load_s")
        return float(v) if isinstance(v, (int, float)) else None

    def uses(self, key: str, now: float) -> float:
        e = self._by_key.get(key, {})
        uses, last = e.get("uses"), e.get("last_used")
        if not isinstance(uses, (int, float)) or not isinstance(last, (int, float)):
            return 0.0
        return decayed_uses(float(uses), float(last), now)

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | fileflags.NOT_INHERITED,
                         0o600)
            try:
                os.write(fd, json.dumps(self._by_key, sort_keys=True).encode("utf-8"))
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as exc:  # a full disk costs an estimate, never a service
            log.warning("could not keep service load times in %s: %s", self.path, exc)
