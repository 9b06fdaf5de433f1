"""Marks for SDK tests whose agent side is POSIX's, each with the reason it skips on Windows.

They run everywhere else. On Windows (under Wine: `nox -s windows`; the windows-latest
workflow job) they skip with one line naming what they rely on; what the SDK does over
Windows' ``handle:<n>`` is tested in test_windows_pipes.py.
"""

from __future__ import annotations

import sys

import pytest

WINDOWS = sys.platform == "win32"

# The kit's Windows side (job objects, duplicated pipe handles) is tested in
# test_conform_windows.py, and test_conform_catches/_inputs/_doctor run there too; these hold
# the kit to what only POSIX shows: descriptors counted in /proc/self/fd, listeners read from
# /proc or caught through psutil (which names no socket's process under Wine), AF_UNIX
# listeners, os.geteuid.
conform_kit = pytest.mark.skipif(
    WINDOWS, reason="holds the kit to POSIX (/proc descriptors and sockets, AF_UNIX "
                    "listeners, geteuid); the kit on Windows: test_conform_windows.py")

# endpoint_helpers.FakeAgent, the tests' stand-in for the agent, speaks fd:<n> with SCM_RIGHTS
# over AF_UNIX socketpairs, which Windows' CPython does not have.
fake_agent = pytest.mark.skipif(
    WINDOWS, reason="the test's agent stand-in passes fd:<n> descriptors with SCM_RIGHTS "
                    "(AF_UNIX); Windows' handle:<n> path: test_windows_pipes.py")
