"""The Windows side of the SDK, run from the Linux suite: Windows' own CPython under Wine.

`harness.tools.windows_tests` (what `nox -s windows` runs) prepares Wine, the embeddable CPython (3.13 unless
OARBANK_WINDOWS_PYTHON names another) and
its Windows wheels (cached under .cache/windows/; the first run downloads ~40 MB and makes a
~700 MB Wine prefix), then these tests run the SDK's pipe-handle tests
(sdk/tests/test_windows_pipes.py), the conformance kit on examples/modelserver
(sdk/tests/test_conform_windows.py) and the agent's Windows backend parts
(agent/tests/test_windows_backend.py, test_windows_streams.py, test_windows_broker.py,
test_windows_controlplane.py, test_windows_groups.py, test_windows_agent.py,
test_windows_token_file.py, test_windows_nudges.py) under python.exe.
Without Wine they skip naming `wine64` (fail under OARBANK_REQUIRE_SYSTEM_PACKAGES=1).

What Wine cannot show (issue 26), so no test here claims it: Windows serialising I/O on a
synchronous pipe handle, job-object memory limits (accepted, not enforced),
`IsProcessInJob` with only PROCESS_QUERY_LIMITED_INFORMATION, AppContainer, psutil's
`name()`/`exe()` of Windows processes. The `windows-latest` workflow job covers those.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# One worker runs both: a run ends every Wine process of the prefix when it is done.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wine"),
              pytest.mark.skipif(sys.platform != "linux", reason="Wine runs on Linux")]


WINDOWS_TESTS = ["sdk/tests/test_windows_pipes.py", "sdk/tests/test_conform_windows.py",
                 "agent/tests/test_windows_backend.py",
                 "agent/tests/test_windows_streams.py", "agent/tests/test_windows_broker.py",
                 "agent/tests/test_windows_controlplane.py",
                 "agent/tests/test_windows_groups.py", "agent/tests/test_windows_agent.py",
                 "agent/tests/test_windows_token_file.py", "agent/tests/test_windows_nudges.py"]


def test_the_windows_tests_pass_under_wine(system_package) -> None:
    system_package("wine64")
    proc = subprocess.run(
        [sys.executable, "-m", "harness.tools.windows_tests", "-q", "-rs", *WINDOWS_TESTS],
        cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # They ran on Windows' python.exe (a Linux interpreter would skip them all).
    summary = re.search(r"^(\d+) passed.* in [\d.]+s", out, re.M)
    assert summary and int(summary[1]) >= 12, out[-4000:]
    assert "skipped" not in summary[0] and "failed" not in summary[0], summary[0]


def test_windows_python_reports_windows(system_package) -> None:
    system_package("wine64")
    from harness.nodes import wine

    cmd, env = wine.prepare()
    code = "import sys, os; print(sys.platform, os.name, hasattr(os, 'register_at_fork'))"
    try:
        # Its output through pipes (python.exe dies on a regular file); prepare() started
        # Wine's services with /dev/null, so none of them holds these pipes open.
        proc = subprocess.run([*cmd, "-c", code], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=300)
    finally:
        wine.end_wine()  # nothing of Wine's left running after the test
    assert proc.stdout.decode().split() == ["win32", "nt", "False"], proc.stderr.decode()
