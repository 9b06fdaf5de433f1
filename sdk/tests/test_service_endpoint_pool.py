"""Pooled ``request()``: idle keep-alive connections reused per service, thread-safe and
bounded; a reused one the service had closed is retried once on a fresh one, only when not a
byte of the response had arrived; and the serve_http side that reuses its threads.

The service is a real process (``endpoint_helpers.py start`` then ``serve``: ``Acceptor`` +
``serve_http`` + ``EchoHandler``), the agent's role played by ``endpoint_helpers.FakeAgent``
over real socketpairs and SCM_RIGHTS, as in test_service_endpoint_http.py.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import endpoint_helpers as H  # sdk/tests (conftest.py puts it on the path)
import pytest
from platform_marks import fake_agent  # sdk/tests

from oarbank_sdk import service_endpoint as ep
from oarbank_sdk.endpoint import job as endpoint_job
from oarbank_sdk.endpoint import pool as pools
from oarbank_sdk.endpoint import service as service_side

pytestmark = fake_agent


@pytest.fixture
def start_service(monkeypatch) -> Iterator[Callable[..., H.FakeAgent]]:
    """``start_service(idle_s=None)``: the service started as the agent starts one, and a
    connector for attempt "att-1" as service "model"."""
    base = H.open_fds()
    started: list[tuple[H.FakeAgent, subprocess.Popen[bytes]]] = []

    def start(idle_s: float | None = None) -> H.FakeAgent:
        agent = H.FakeAgent(channel=True)
        child_fd = agent.channel_child.fileno()
        env = dict(os.environ, OARBANK_ENDPOINT_CHANNEL=f"fd:{child_fd}")
        if idle_s is not None:
            env["ENDPOINT_HELPER_IDLE_S"] = str(idle_s)
        proc = subprocess.Popen([sys.executable, str(Path(H.__file__)), "start"], env=env,
                                pass_fds=(child_fd,), stdout=subprocess.DEVNULL,
                                start_new_session=True)
        started.append((agent, proc))
        agent.close_child_end()
        assert proc.wait(30) == 0
        job_end = agent.open_connector("att-1")
        monkeypatch.setenv("OARBANK_SERVICE_MODEL", f"fd:{job_end.detach()}")
        return agent

    yield start
    endpoint_job._forget_connectors()  # the connectors and the pooled connections
    for agent, proc in started:
        agent.close()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the daemon stays in start's group
        except ProcessLookupError:
            pass
    extra = H.fds_settle(base)
    assert not extra, f"descriptors leaked: {sorted(extra)}"


def _pool() -> pools.Pool:
    return pools.pool_for("model", os.environ["OARBANK_SERVICE_MODEL"])


def _seen() -> dict[str, int]:
    # Connection: close: this look does not take a pooled connection, nor leave one.
    return ep.request("model", "GET", "/seen", headers={"Connection": "close"}).json()


def test_requests_reuse_one_connection(start_service) -> None:
    agent = start_service()
    for i in range(5):
        r = ep.request("model", "POST", "/p", {"i": i})
        assert r.status == 201 and json.loads(r.json()["body"]) == {"i": i}
    assert len(agent.connect_pids) == 1  # five requests, one brokered connection
    assert _pool().idle == 1
    assert _seen()["/p"] == 5


def test_connection_close_is_not_pooled(start_service) -> None:
    agent = start_service()
    for _ in range(2):
        assert ep.request("model", "GET", "/x", headers={"Connection": "close"}).status == 200
    assert len(agent.connect_pids) == 2 and _pool().idle == 0


def test_a_connection_the_service_closed_while_idle_is_not_used(start_service) -> None:
    agent = start_service(idle_s=0.2)
    assert ep.request("model", "GET", "/a").status == 200
    (idle,) = _pool()._idle
    # The service closes it once idle (its handler's timeout): wait until it has.
    assert H.poll(lambda: pools.looks_closed(idle.sock), timeout=30)
    assert ep.request("model", "GET", "/b").status == 200
    assert len(agent.connect_pids) == 2  # the closed one was dropped, a fresh one asked for
    seen = _seen()
    assert (seen["/a"], seen["/b"]) == (1, 1)


def test_a_closed_connection_found_on_writing_is_retried_once(start_service,
                                                              monkeypatch) -> None:
    agent = start_service(idle_s=0.2)
    assert ep.request("model", "GET", "/a").status == 200
    (idle,) = _pool()._idle
    assert H.poll(lambda: pools.looks_closed(idle.sock), timeout=30)
    # As if it closed between the pool's check and our write (a race the check cannot see).
    monkeypatch.setattr(pools, "looks_closed", lambda sock: False)
    assert ep.request("model", "GET", "/b").status == 200
    assert len(agent.connect_pids) == 2
    assert _seen()["/b"] == 1


def test_closed_before_a_byte_of_answer_is_retried_on_a_fresh_connection(start_service) -> None:
    agent = start_service()
    assert ep.request("model", "GET", "/warm").status == 200
    # The service reads it on the reused connection, then closes without a byte of answer.
    r = ep.request("model", "GET", "/drop-reused")
    assert r.status == 200  # answered on the fresh connection
    assert len(agent.connect_pids) == 2
    assert _seen()["/drop-reused"] == 2  # dropped once, answered once


def test_never_retried_once_a_byte_of_answer_arrived(start_service) -> None:
    agent = start_service()
    assert ep.request("model", "GET", "/warm").status == 200
    with pytest.raises(http.client.HTTPException):
        ep.request("model", "GET", "/partial-reused")
    assert len(agent.connect_pids) == 1  # no fresh connection: the request was not sent again
    assert _seen()["/partial-reused"] == 1
    assert _pool().idle == 0  # the broken connection was not pooled


def test_threads_share_the_pool_and_it_stays_bounded(start_service) -> None:
    agent = start_service()
    n = H.EchoHandler.GATHER  # the service answers /gather once this many wait at once
    assert n > pools.MAX_IDLE
    errors: list[BaseException] = []
    statuses: list[int] = []

    def gather() -> None:
        try:
            statuses.append(ep.request("model", "GET", "/gather", timeout=60).status)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=gather) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors and statuses == [200] * n
    assert len(agent.connect_pids) == n  # all at once: one connection each
    assert _pool().idle == pools.MAX_IDLE  # the rest were closed, not kept

    def burst(i: int) -> None:
        try:
            for j in range(10):
                r = ep.request("model", "POST", "/p", {"i": i, "j": j}, timeout=60)
                assert json.loads(r.json()["body"]) == {"i": i, "j": j}
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors
    assert len(agent.connect_pids) == n  # 40 more requests from 4 threads: no new connection
    assert _seen()["/p"] == 40


def test_ended_cuts_pooled_connections_and_the_next_request_gets_a_fresh_one(
        start_service) -> None:
    agent = start_service()
    assert ep.request("model", "GET", "/a").status == 200
    (idle,) = _pool()._idle
    agent.send_ended("att-1")  # the attempt is over: the service closes what is left of it
    assert H.poll(lambda: pools.looks_closed(idle.sock), timeout=30)
    assert ep.request("model", "GET", "/b").status == 200
    assert len(agent.connect_pids) == 2


def test_a_forked_child_drops_the_parents_idle_connections(start_service) -> None:
    agent = start_service()
    assert ep.request("model", "GET", "/a").status == 200
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its pool starts empty; the parent's connection is untouched
        try:
            idle = pools.pool_for("model", os.environ["OARBANK_SERVICE_MODEL"]).idle
            os.write(w, str(idle).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        assert f.read() == "0"
    assert os.waitpid(pid, 0)[1] == 0
    assert ep.request("model", "GET", "/b").status == 200
    assert len(agent.connect_pids) == 1  # the parent's connection still serves


# --- serve_http's side: worker threads reused ---------------------------------------------------


def _worker_names(prefix: str) -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith(prefix + "-")}


def test_workers_reuse_an_idle_thread_keep_a_few_and_let_the_rest_go() -> None:
    workers = service_side._Workers("wtest", keep=2, idle_s=0.5)
    names: list[str] = []
    for _ in range(5):
        done = threading.Event()
        workers.run(lambda done=done: (names.append(threading.current_thread().name),
                                       done.set()))
        assert done.wait(30)
        assert H.poll(lambda: workers._idle == 1, timeout=30)  # back in the pool
    assert set(names) == {"wtest-1"}  # one after another: one thread did them all
    # Four at once: four threads; once they are done at most `keep` wait, the rest end.
    gate = threading.Barrier(4)
    ran = []
    for _ in range(4):
        workers.run(lambda: ran.append(gate.wait(30)))
    assert H.poll(lambda: len(ran) == 4, timeout=30)
    assert H.poll(lambda: workers._idle == 2 and len(_worker_names("wtest")) == 2, timeout=30)
    # Idle past idle_s: they end too.
    assert H.poll(lambda: not _worker_names("wtest") and workers._idle == 0, timeout=30)


def test_serve_http_serves_connections_one_after_another_on_few_threads(start_service) -> None:
    agent = start_service()
    for _ in range(6):
        assert ep.request("model", "GET", "/x", headers={"Connection": "close"}).status == 200
    assert len(agent.connect_pids) == 6 and _seen()["/x"] == 6
