"""The agent's pipe ends on Windows: overlapped, watched on the proactor loop, read and written
with the non-blocking calls the broker's MessageStream makes, a real child at the other end.

Windows only: under Wine with Windows' own CPython (``nox -s windows -- -q
agent/tests/test_windows_streams.py``; harness/tests/test_wine.py runs it from the Linux
suite), and on real Windows in the ``windows-latest`` workflow job. The child speaks through
the SDK's synchronous ``PipeStream``, as a service or a runner does.

Wine does not show, so this cannot either: Windows serialising I/O on a synchronous handle
(the reason the agent's own end is overlapped: under Wine a synchronous end would pass too).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "win32",
    reason="Windows overlapped pipes: run under Wine by `nox -s windows`, or on Windows")

if sys.platform == "win32":
    from oarbank_agent.platform.windows.streams import AgentPipe, WindowsStreams
    from oarbank_sdk.protocol import current_transport

# Lines in, "echo:<line>" out; "size <n>" reads n bytes and answers their count; "bye" ends.
CHILD = r"""
import sys
from oarbank_sdk._transport import current
conn = current().open_stream(int(sys.argv[1]))
f = conn.makefile("rb")
for line in f:
    if line.startswith(b"size "):
        n = int(line.split()[1])
        got = len(f.read(n))
        conn.sendall(b"got %d\n" % got)
    elif line == b"bye\n":
        break
    else:
        conn.sendall(b"echo:" + line)
f.close()
conn.close()
"""


def _child(theirs: Any) -> subprocess.Popen:
    kwargs = current_transport().inheritable_kwargs(theirs.fileno())
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(theirs.fileno())],
                            stdin=subprocess.DEVNULL, **kwargs)
    theirs.close()  # the child has its copy
    return proc


class Reader:
    """What MessageStream does on readable: one recv per callback, until end of file."""

    def __init__(self, pipe: AgentPipe) -> None:
        self.pipe = pipe
        self.data = bytearray()
        self.eof = asyncio.get_running_loop().create_future()
        self.calls = 0

    def on_readable(self) -> None:
        self.calls += 1
        try:
            chunk = self.pipe.recv(65536)
        except BlockingIOError:
            return
        if chunk:
            self.data += chunk
        elif not self.eof.done():
            self.eof.set_result(None)

    async def until(self, text: bytes, timeout: float = 20) -> None:
        async def wait() -> None:
            while text not in self.data:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(wait(), timeout)


async def _send_when_free(pipe: AgentPipe, data: bytes) -> int:
    """Send once the previous write's completion has been collected (the echo of a line can
    arrive before its write's completion is)."""
    for _ in range(200):
        try:
            return pipe.send(data)
        except BlockingIOError:
            await asyncio.sleep(0.01)
    raise AssertionError("a write stayed in flight for 2 s")


def _run(main: Any) -> Any:
    loop = asyncio.ProactorEventLoop()  # type: ignore[attr-defined]
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def test_lines_go_both_ways_and_the_end_is_seen() -> None:
    async def main() -> None:
        streams = WindowsStreams()
        ours, theirs = streams.child_pair()
        proc = _child(theirs)
        watcher = streams.watcher(asyncio.get_running_loop())
        reader = Reader(ours)
        try:
            watcher.on_readable(ours.fileno(), reader.on_readable)  # a handle value, as MessageStream
            assert ours.send(b"hello\n") == 6
            await reader.until(b"echo:hello\n")
            assert await _send_when_free(ours, b"again\n") == 6
            await reader.until(b"echo:again\n")
            await _send_when_free(ours, b"bye\n")
            await asyncio.wait_for(reader.eof, 20)  # the child closed its end: recv says b""
            assert ours.recv(10) == b""
            assert watcher.off_readable(ours) is True
            assert watcher.off_readable(ours) is False
            assert proc.wait(timeout=20) == 0
        finally:
            ours.close()
            if proc.poll() is None:
                proc.kill()
    _run(main)


def test_a_write_in_flight_holds_the_next_one_until_it_completes() -> None:
    """A chunk larger than the pipe's buffer stays in flight until the child reads it: the
    next send says BlockingIOError, and a watched writer runs once the write completed."""
    async def main() -> None:
        streams = WindowsStreams()
        ours, theirs = streams.child_pair()
        proc = _child(theirs)
        loop = asyncio.get_running_loop()
        watcher = streams.watcher(loop)
        reader = Reader(ours)
        writable = loop.create_future()
        payload = b"x" * (1 << 20)
        try:
            watcher.on_readable(ours, reader.on_readable)
            assert ours.send(b"size %d\n" % len(payload)) > 0
            # once the header's write completed (the child reads lines), the payload goes whole
            assert await _send_when_free(ours, payload) == len(payload)
            with pytest.raises(BlockingIOError):
                ours.send(b"more")
            watcher.on_writable(ours, lambda: writable.done() or writable.set_result(None))
            await asyncio.wait_for(writable, 30)
            assert watcher.off_writable(ours) is True
            await reader.until(b"got %d\n" % len(payload), timeout=30)
            await _send_when_free(ours, b"bye\n")
            await asyncio.wait_for(reader.eof, 20)
        finally:
            ours.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=20)
    _run(main)


def test_a_dead_child_reads_as_end_of_file_and_breaks_writes() -> None:
    async def main() -> None:
        streams = WindowsStreams()
        ours, theirs = streams.child_pair()
        proc = _child(theirs)
        watcher = streams.watcher(asyncio.get_running_loop())
        reader = Reader(ours)
        try:
            watcher.on_readable(ours, reader.on_readable)
            proc.kill()
            proc.wait(timeout=20)
            await asyncio.wait_for(reader.eof, 20)
            with pytest.raises(OSError):
                for _ in range(3):  # the first may be taken before the break is known
                    ours.send(b"anyone?\n")
                    await asyncio.sleep(0.2)
        finally:
            ours.close()
    _run(main)


def test_closed_ends_are_not_watched_and_foreign_handles_are_refused() -> None:
    async def main() -> None:
        streams = WindowsStreams()
        ours, theirs = streams.child_pair()
        theirs.close()
        watcher = streams.watcher(asyncio.get_running_loop())
        handle = ours.fileno()
        ours.close()
        ours.close()  # idempotent
        assert ours.fileno() == -1
        assert watcher.off_readable(handle) is False
        with pytest.raises(ValueError, match="not one of the agent's overlapped pipe ends"):
            watcher.on_readable(handle, lambda: None)
        with pytest.raises(OSError):
            ours.recv(1)
    _run(main)


def test_a_log_pipe_carries_a_child_s_stderr_to_its_end() -> None:
    """``pipe()``: the write end a descriptor ``subprocess`` hands on as a child's stderr, the
    read end the agent's, read when the loop says so, end of file once the child is gone."""
    async def main() -> None:
        streams = WindowsStreams()
        r, w = streams.pipe()
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stderr.write('x' * 100000 + 'end')"],
            stdin=subprocess.DEVNULL, stderr=w)
        os.close(w)  # the child has its copy
        got = bytearray()
        done = asyncio.get_running_loop().create_future()

        def readable() -> None:
            chunk = streams.read_some(r, 65536)
            if chunk is None:
                return
            if chunk:
                got.extend(chunk)
            elif not done.done():
                done.set_result(None)

        watcher = streams.watcher(asyncio.get_running_loop())
        try:
            watcher.on_readable(r, readable)
            await asyncio.wait_for(done, 30)
            assert bytes(got) == b"x" * 100000 + b"end"
            assert proc.wait(timeout=20) == 0
        finally:
            watcher.off_readable(r)
            streams.close_read_end(r)
            streams.close_read_end(r)  # closed already: nothing to do
            if proc.poll() is None:
                proc.kill()
    _run(main)
