"""Constants the harness tests share (importable: conftest puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ECHO = HERE / "modules" / "echo"
ECHO_ID = "dev.oarbank.e2e.echo"
