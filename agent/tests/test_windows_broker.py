"""The broker on Windows: a job's connect reaches a service through pipe ends duplicated into
each process, a pid outside the attempt's job object is refused ``bad_pid``.

Windows only: under Wine with Windows' own CPython (``nox -s windows -- -q
agent/tests/test_windows_broker.py``; harness/tests/test_wine.py runs it from the Linux suite),
and on real Windows in the ``windows-latest`` workflow job. Real processes in real job
objects, the SDK's own job and service sides, the agent's real ``Broker`` on the proactor
loop. The backend is assembled here from the two parts the broker asks for (streams and
hand-overs), so that the broker is all that runs of the agent; the test plays the
supervisor's and the runner launcher's part: starting the two processes in their job
objects (test_windows_agent.py runs the whole agent).
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
    reason="Windows pipe-handle hand-overs: run under Wine by `nox -s windows`, or on Windows")

if sys.platform == "win32":
    from oarbank_agent import platform
    from oarbank_agent.broker.handover import Broker
    from oarbank_agent.platform.api import Backend
    from oarbank_agent.platform.windows.handover import DuplicatingHandovers
    from oarbank_agent.platform.windows.streams import WindowsStreams
    from oarbank_sdk.protocol import current_transport
    from oarbank_sdk.winjob import JobObject, start_in_job

SERVICE = r"""
from oarbank_sdk.service_endpoint import Acceptor
acc = Acceptor()
for conn, attempt in acc:
    data = conn.recv(100)
    conn.sendall(b"pong:%s:%s" % (str(attempt).encode(), data))
    conn.close()
"""
JOB = r"""
import sys
from oarbank_sdk.service_endpoint import EndpointError, connect
try:
    s = connect("echo", timeout=20)
except EndpointError as exc:
    print("refused", exc.code, flush=True)
    sys.exit(3)
s.sendall(b"ping")
print(s.recv(100).decode(), flush=True)
s.close()
"""


class Ready:
    """The supervisor's gate: the service is ready once it said hello."""

    def __init__(self, broker_ref: list[Any]) -> None:
        self.broker_ref = broker_ref

    async def wait_ready(self, service_key: str) -> bool:
        ch = self.broker_ref[0].channels.get(service_key)
        if ch is None:
            return False
        await asyncio.wait_for(asyncio.shield(ch.hello), 20)
        return True


@pytest.fixture
def windows_broker_backend() -> Any:
    saved = platform._backend
    platform._backend = Backend(  # type: ignore[call-arg]
        name="windows", streams=WindowsStreams(), handovers=DuplicatingHandovers(),
        sandbox=None, sessions=None, endpoint=None, statedir=None, requests=None, loops=None,
        factory=None, groups=None)
    yield
    platform._backend = saved


def _start(code: str, job: JobObject, env_name: str, handle: int) -> subprocess.Popen:
    transport = current_transport()
    env = {**os.environ, env_name: transport.format(handle)}
    return start_in_job([sys.executable, "-c", code], job, env=env, stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE, **transport.inheritable_kwargs(handle))


async def _output(proc: subprocess.Popen) -> tuple[int, str]:
    out, _ = await asyncio.to_thread(proc.communicate, timeout=60)
    return proc.returncode, out.decode().strip()


def test_a_connect_reaches_the_service_and_a_stranger_pid_is_refused(
        windows_broker_backend: Any) -> None:
    async def main() -> None:
        ref: list[Any] = []
        broker = Broker(Ready(ref))
        ref.append(broker)
        service_job, runner_job, stranger_job = JobObject(), JobObject(), JobObject()
        procs: list[subprocess.Popen] = []
        try:
            ch = broker.open_channel("m.echo")
            service = _start(SERVICE, service_job, "OARBANK_ENDPOINT_CHANNEL", ch.child_fd)
            procs.append(service)
            ch.close_child_end()
            ch.owns = service_job.contains  # the start op's group, as the supervisor sets it
            await asyncio.wait_for(asyncio.shield(ch.hello), 30)
            assert ch.hello.result() == service.pid

            # An attempt whose runner is in its job object: served.
            fd = broker.open_connector("job-1.a1", "m.echo")
            runner = _start(JOB, runner_job, "OARBANK_SERVICE_ECHO", fd)
            procs.append(runner)
            broker.close_child_ends("job-1.a1")
            broker.own("job-1.a1", runner_job.contains)
            wire_id = broker.wire_attempt("job-1.a1")
            assert await _output(runner) == (0, f"pong:{wire_id}:ping")

            # A connect whose pid is not in the attempt's job object: bad_pid, nothing handed.
            fd = broker.open_connector("job-2.a1", "m.echo")
            stranger = _start(JOB, stranger_job, "OARBANK_SERVICE_ECHO", fd)
            procs.append(stranger)
            broker.close_child_ends("job-2.a1")
            broker.own("job-2.a1", runner_job.contains)  # another attempt's job object
            assert await _output(stranger) == (3, "refused bad_pid")

            broker.end_attempt("job-1.a1")
            broker.end_attempt("job-2.a1")
            assert broker.stats()["pending_ends"] == 0  # every receipt came, every copy closed
            ch.close()  # EOF: the service's acceptor ends its loop
            assert (await _output(service))[0] == 0
        finally:
            await broker.aclose()
            for job in (service_job, runner_job, stranger_job):
                job.close()
            for p in procs:
                if p.poll() is None:
                    p.kill()
    loop = asyncio.ProactorEventLoop()  # type: ignore[attr-defined]
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
