"""Marks for SDK tests whose agent side is POSIX's, each with the reason it skips on Windows.

They run everywhere else. On Windows (under Wine: `nox -s windows`; the windows-latest
workflow job) they skip with one line naming what they rely on; what the SDK does over
Windows' ``handle:<n>`` is tested in test_windows_pipes.py.
"""

from __future__ import annotations

import sys

import pytest

WINDOWS = sys.platform == "win32"

# The conformance kit plays the agent with POSIX process groups (killpg, getpgid) and fd:<n>
# descriptors over socketpairs; its Windows side (job objects, duplicated pipe handles) is
# not written yet (issue 26).
conform_kit = pytest.mark.skipif(
    WINDOWS, reason="the conformance kit's agent side is POSIX's (process groups, fd:<n> "
                    "with SCM_RIGHTS); not written for Windows yet")

# endpoint_helpers.FakeAgent, the tests' stand-in for the agent, speaks fd:<n> with SCM_RIGHTS
# over AF_UNIX socketpairs, which Windows' CPython does not have.
fake_agent = pytest.mark.skipif(
    WINDOWS, reason="the test's agent stand-in passes fd:<n> descriptors with SCM_RIGHTS "
                    "(AF_UNIX); Windows' handle:<n> path: test_windows_pipes.py")
