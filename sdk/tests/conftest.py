"""The SDK tests' shared helpers (endpoint_helpers.py, sandbox_helpers.py) import by name from
the tests."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
