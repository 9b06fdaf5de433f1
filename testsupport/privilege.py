"""Tests that need root, run by an ordinary user: skipped with one line saying why (the
README's commands do not say to be root), counted at the end of the run by the root
conftest. A test, or a helper it calls, calls ``require_root("why")`` where it needs the
privilege, so that what an ordinary user can check is checked first."""

from __future__ import annotations

import os

import pytest

__all__ = ["ROOT_SKIP_PREFIX", "require_root", "AGENT_UNDUMPABLE"]

ROOT_SKIP_PREFIX = "needs root"

# The agent makes itself undumpable (no process of its user may read or trace it), so the
# kernel shows its /proc/<pid>/fd and fdinfo to root alone.
AGENT_UNDUMPABLE = "reads the undumpable agent's /proc/<pid>/fd, which only root may"


def require_root(why: str) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"{ROOT_SKIP_PREFIX}: {why}")
