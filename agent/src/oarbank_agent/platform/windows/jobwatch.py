"""Job messages on Windows: one completion port for every group's job object, read by one
thread, so that a group's end is an event (its last process exited) and its memory-limit hits
are counted.

The kernel posts a message for each job it is told of (``watch``): ``ACTIVE_PROCESS_ZERO``
wakes whoever waits for that job (on the waiter's event loop), a memory-limit message adds
one to the job's count. Windows does not promise every message arrives, so waiters also look
at the job's process count now and then (``JobGroup.wait_gone``).
"""

from __future__ import annotations

import asyncio
import itertools
import threading

from oarbank_agent.platform.windows import jobapi, winapi

__all__ = ["JobWatch"]


class JobWatch:
    """The port, its reader thread (started at the first ``watch``), and what it heard."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._keys = itertools.count(1)
        self._memory_hits: dict[int, int] = {}
        self._waiters: dict[int, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}

    def watch(self, job: int) -> int:
        """Have ``job``'s messages come here; its key (for ``gone`` and ``memory_hits``)."""
        with self._lock:
            if self._port is None:
                self._port = jobapi.new_port()
                self._thread = threading.Thread(target=self._read, args=(self._port,),
                                                name="oarbank-job-messages", daemon=True)
                self._thread.start()
            key = next(self._keys)
            self._memory_hits[key] = 0
            port = self._port
        jobapi.watch_job(job, port, key)
        return key

    def memory_hits(self, key: int) -> int:
        return self._memory_hits.get(key, 0)

    def gone(self, key: int) -> asyncio.Future[None]:
        """A future on the running loop, done when the job's last process has exited (told
        by the port; the caller also checks the count, since a message may be missed)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiters.setdefault(key, []).append((loop, fut))
        return fut

    def forget(self, key: int) -> None:
        with self._lock:
            self._waiters.pop(key, None)
            self._memory_hits.pop(key, None)

    def close(self) -> None:
        """Stop the reader thread and close the port (the agent is stopping)."""
        with self._lock:
            port, thread, self._port, self._thread = self._port, self._thread, None, None
        if port is None:
            return
        jobapi.post_quit(port)
        if thread is not None:
            thread.join(timeout=5.0)
        winapi.close(port)

    def _read(self, port: int) -> None:
        while True:
            try:
                got = jobapi.next_message(port)
            except OSError:
                return  # the port was closed under us
            if got is None:
                return
            msg, key, _pid = got
            if msg in jobapi.MSG_MEMORY_LIMITS:
                with self._lock:
                    if key in self._memory_hits:
                        self._memory_hits[key] += 1
            elif msg == jobapi.MSG_ACTIVE_PROCESS_ZERO:
                with self._lock:
                    waiters = self._waiters.pop(key, [])
                for loop, fut in waiters:
                    try:
                        loop.call_soon_threadsafe(_done, fut)
                    except RuntimeError:
                        pass  # that loop is closed: nobody waits there any more


def _done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
