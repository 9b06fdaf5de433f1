"""The conformance kit on Windows: it plays the Windows agent (job objects, pipe ends duplicated
into the receiving process) and the reference module passes; what needs a Linux wall says it
was not run. Windows only (under Wine: `nox -s windows`, harness/tests/test_wine.py; the
windows-latest workflow job); real processes, pipes and job objects, nothing faked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "win32",
                                reason="the kit's Windows side (job objects, handle:<n>)")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "modelserver"


def test_the_reference_module_passes_the_kit_on_windows() -> None:
    proc = subprocess.run([sys.executable, "-m", "oarbank_sdk", "conform", str(EXAMPLE), "--json"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["failed"] == 0, report
    for name in ("service model: hello", "service model: ready", "golden hello",
                 "golden several_prompts", "spec generate", "service model: ended",
                 "service model: channel protocol", "service model: stop",
                 "service model: process group gone"):
        assert checks[name]["status"] == "ok", checks.get(name)
    # Handed over the Windows way: every connection the kit made was accepted. Five are the
    # kit's own (the specs and the connections left open for `ended`); the goldens' runner opens
    # one for "hello" and one to three for "several_prompts" (three threads share kept-alive
    # connections, so how many it opens depends on timing).
    detail = checks["service model: channel protocol"]["detail"]
    handed = re.fullmatch(r"(\d+) connection\(s\) handed, all accepted", detail)
    assert handed is not None, detail
    assert 7 <= int(handed.group(1)) <= 9, detail
    # What needs a Linux wall is said, never passed.
    for name in ("sandbox", "network attempts"):
        assert checks[name]["status"] == "warn", checks[name]
        assert "not run on win32" in checks[name]["detail"], checks[name]
    from oarbank_sdk.conform.listeners import blind_spot

    listening = checks["service model: never listens (after requests)"]
    if blind_spot() is None:  # real Windows: psutil names each socket's process
        assert listening["status"] == "ok", listening
    else:  # Wine: it names none, so the check is not run, and says so
        assert listening["status"] == "warn" and "not run" in listening["detail"], listening


def test_a_connect_from_outside_the_attempt_is_bad_pid() -> None:
    from oarbank_sdk import winjob
    from oarbank_sdk._winpipe import PipeStream
    from oarbank_sdk.conform import host

    channel = host.Channel()
    connector = host.Connector("conform-outsider", channel)
    job = winjob.JobObject()
    connector.job = job  # the attempt's job object holds nothing: this process is no member
    assert connector.child_fd is not None
    ours = PipeStream(connector.child_fd)
    connector.child_fd = None  # ours now
    try:
        ours.sendall(b'{"op":"connect","pid":%d}\n' % os.getpid())
        ours.settimeout(10)
        line = b""
        while not line.endswith(b"\n"):
            chunk = ours.recv(4096)
            assert chunk, "the connector closed without answering"
            line += chunk
        answer = json.loads(line)
        assert answer["ok"] is False and answer["error"] == "bad_pid", answer
    finally:
        ours.close()
        connector.close()
        channel.close()
        job.close()


def open_handles() -> int:
    """Our open handles, counted by asking each value (Wine's GetProcessHandleCount and
    psutil's num_handles say 0 there)."""
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32")  # type: ignore[attr-defined]  (Windows only)
    flags = wintypes.DWORD()
    return sum(1 for h in range(4, 1 << 16, 4)
               if kernel32.GetHandleInformation(wintypes.HANDLE(h), ctypes.byref(flags)))


def test_the_kit_releases_every_handle_it_made() -> None:
    import gc
    import io

    from oarbank_sdk import conform

    def run() -> tuple[int, dict]:
        out = io.StringIO()
        rc = conform.run(EXAMPLE, json_output=True, sandbox=False, stream=out)
        gc.collect()
        return rc, json.loads(out.getvalue())

    rc, first = run()
    assert rc == 0, first  # the first run also loads what stays loaded (DLLs, caches)
    before = open_handles()
    _rc, second = run()
    # The same checks ran (whatever a loaded machine made of an op's 5 s under Wine: the
    # reference module passing is the test above's), and every handle they made is closed.
    assert [c["name"] for c in second["checks"]] == [c["name"] for c in first["checks"]], second
    assert open_handles() == before  # job objects, pipe ends, processes: all closed
