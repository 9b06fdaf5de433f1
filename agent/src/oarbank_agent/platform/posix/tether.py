"""Fate sharing on POSIX: a job's runner, and everything it started, does not outlive the agent.

The agent's side. ``python -I -m oarbank_agent.platform.posix.tetherwatch <state dir> <fd>``
(``tetherwatch.py``): one small watcher per agent (``PosixTetherHost.start``), in a session
of its own. It holds the read end of a pipe whose only write end is the agent's (not
inheritable, never passed on: no child, the process factory and the keeper included, holds a
copy). When the agent ends, however it ends (SIGKILL
included), the kernel closes that end and the watcher reads EOF at once; it then kills every
runner group recorded in ``<state>/procs`` (``kind`` ``runner``) that is still alive: the
process group with ``killpg``, and on Linux its cgroup too (``Group.kill``), so a grandchild
goes with it. Services are left alone: the next agent decides on them (``recovery``; with
``--keep-services`` they stay up).

Why a pipe and not ``PR_SET_PDEATHSIG`` on the runner: the death signal reaches only the
process that asked for it (the runner's children live on), fires when the *thread* that forked
it ends (not the agent), is cleared by a set-uid exec, and its parent is not the agent when
the process factory forks the runner or the sandbox launcher sits in between. EOF on a pipe
needs none of that and is the same on Linux and macOS. What holds: a runner whose group record
was not yet written when the agent died (the few microseconds after its fork,
``procs.spawn``) is ended by the next agent instead; on macOS (no cgroups) a runner's child
that left the process group (``setsid``) is not reached, as on the agent's own ends there.
Windows needs no watcher: every group is a kill-on-close job object whose only handle is the
agent's, so the system ends the runner's job when the agent dies.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["PosixTetherHost", "PosixTether"]

class PosixTether:
    """The agent's side: the write end, and the watcher to reap at a clean stop."""

    def __init__(self, proc: subprocess.Popen[bytes], write_end: int) -> None:
        self.proc = proc
        self._write_end: int | None = write_end

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        """The agent stops cleanly (its runners are ended by then): let the watcher go."""
        if self._write_end is not None:
            os.close(self._write_end)
            self._write_end = None

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()


class PosixTetherHost:
    def start(self, state_dir: Path) -> PosixTether:
        """The watcher for the agent of ``state_dir``. Raises OSError if it cannot start."""
        read_end, write_end = os.pipe()  # both close-on-exec (PEP 446)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-m", "oarbank_agent.platform.posix.tetherwatch",
                 str(state_dir), str(read_end)],
                stdin=subprocess.DEVNULL, pass_fds=(read_end,), close_fds=True,
                start_new_session=True)  # a Ctrl-C to the agent's terminal is the agent's
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        return PosixTether(proc, write_end)
