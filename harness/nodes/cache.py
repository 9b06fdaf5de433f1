"""Where the harness keeps what outlives one run: base rootfs tarballs, wheels, the Docker
engine's data. `OARBANK_HARNESS_CACHE` overrides; root uses /var/cache, others ~/.cache."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    env = os.environ.get("OARBANK_HARNESS_CACHE")
    if env:
        path = Path(env)
    elif hasattr(os, "geteuid") and os.geteuid() == 0:
        path = Path("/var/cache/oarbank-harness")
    else:
        path = Path.home() / ".cache" / "oarbank-harness"
    path.mkdir(parents=True, exist_ok=True)
    return path
