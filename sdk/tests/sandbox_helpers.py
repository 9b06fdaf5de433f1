"""What the sandbox tests share: running a launch so that nothing of it outlives the call."""

from __future__ import annotations

import os
import signal
import subprocess

TIMEOUT_S = 60


def run_in_own_group(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run in its own process group and make sure nothing of it outlives the call."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
