"""examples/modelserver with real processes: the test plays the agent.

The service's ops run as real subprocesses in their own process groups with the contract's op
environment; the channel is a real socketpair whose child end `start` passes on; connections
are real socketpairs handed over the channel with SCM_RIGHTS (``oarbank_sdk.conform.host``,
built on ``_wire``/``_transport``; the test's helpers are ``modelserver_helpers.py``). The full
agent's tests live in agent/tests.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from modelserver_helpers import BUNDLE, EndpointHTTP, Service, argvs, post  # sdk/tests
from modelserver_helpers import run_job as _run_job
from platform_marks import conform_kit  # sdk/tests

from oarbank_sdk import doctorform
from oarbank_sdk.conform import host

SERVICE_ARGV, RUNNER_ARGV = argvs()
LOAD_S = 0.6


pytestmark = conform_kit


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def service():
    before = open_fds()
    svc = Service({"load_s": LOAD_S, "slots": 3, "model_gb": 1.5})
    try:
        yield svc
    finally:
        svc.cleanup()
    assert svc.pgid is None or host.group_pids(svc.pgid) == []
    assert open_fds() == before


@pytest.fixture
def ready_service(service):
    assert service.start().rc == 0
    assert service.channel.wait_hello(10)
    assert service.wait_ready()["ready"] is True
    return service


# --- ops -------------------------------------------------------------------------------------


def test_fingerprint_reports_settings_and_defaults(service):
    r = service.op("fingerprint")
    assert r.rc == 0
    assert r.doc == {
        "service_protocol": {"supported": [1]},
        "health": "healthy",
        "pools": {"model": 3},
        "reserve": {"mem_gb": 1.5},
        "running": False,
    }
    service.node.settings_file.write_text("{}")
    assert service.op("fingerprint").doc["pools"] == {"model": 4}
    assert service.op("fingerprint").doc["reserve"] == {"mem_gb": 0.5}


def test_bad_settings_fail_the_op_naming_the_setting(service):
    service.node.settings_file.write_text(json.dumps({"slots": "four"}))
    r = service.op("fingerprint")
    assert r.rc == 1
    assert "'slots' must be a positive integer" in r.stderr
    service.node.settings_file.write_text("{not json")
    r = service.op("start")
    assert r.rc == 1 and "cannot read it as JSON" in r.stderr


def test_start_without_channel_is_refused(service):
    r = service.op("start")
    assert r.rc == 1
    assert "OARBANK_ENDPOINT_CHANNEL is not set" in r.stderr
    assert service.op("status").doc == {"running": False, "ready": False}


def test_hello_then_ready_only_after_the_model_loaded(service):
    # A slow load (3 s) leaves room to observe the service between hello and loaded.
    service.node.settings_file.write_text(json.dumps({"load_s": 3.0}))
    r = service.start()
    assert r.rc == 0 and r.doc == {"ok": True}
    assert service.loads() == []  # start returned without waiting for the load
    pid = service.channel.wait_hello(10)
    assert pid is not None
    # hello comes first, the load after it: right after hello the model is not loaded yet
    assert service.op("ready").doc == {"running": True, "ready": False}
    assert service.loads() == []
    assert service.wait_ready()["ready"] is True
    assert service.loads() == [str(pid)]
    assert service.op("status").doc == {"running": True, "ready": True}
    assert service.op("fingerprint").doc["running"] is True


def test_start_is_idempotent(ready_service):
    pid = ready_service.channel.hello_pid
    env = host.op_env(ready_service.node, "model")
    r = host.run_op(SERVICE_ARGV, "start", env, BUNDLE, 10)  # no channel: already running
    assert r.rc == 0 and r.doc == {"ok": True}
    time.sleep(LOAD_S + 0.2)
    assert ready_service.loads() == [str(pid)]
    assert ready_service.op("list_owned").doc == {"objects": []}


# --- HTTP over handed connections --------------------------------------------------------------


def test_generate_keep_alive_404_400_over_one_handed_connection(ready_service):
    pid = ready_service.channel.hello_pid
    conn = EndpointHTTP(ready_service.hand())
    try:
        status, doc = post(conn, "/v1/generate", b'{"prompt": "hello"}')
        assert status == 200
        assert doc == {"text": "olleh [2cf24dba]", "loads": 1, "pid": pid}
        # same connection (keep-alive), same deterministic answer
        assert post(conn, "/v1/generate", b'{"prompt": "hello"}') == (200, doc)
        status, doc = post(conn, "/v1/nope", b"{}")
        assert status == 404 and "/v1/nope" in doc["error"]
        status, doc = post(conn, "/v1/generate", b"not json")
        assert status == 400 and "not JSON" in doc["error"]
        status, doc = post(conn, "/v1/generate", b"[1, 2]")
        assert status == 400 and "JSON object" in doc["error"]
        status, doc = post(conn, "/v1/generate", b'{"text": "hi"}')
        assert status == 400 and "'prompt' must be a string, got missing" in doc["error"]
        status, doc = post(conn, "/v1/generate", b'{"prompt": 7}')
        assert status == 400 and "got a int" in doc["error"]
        status, doc = post(conn, "/v1/generate", b"", method="GET")
        assert status == 405
        # the connection is still usable after every error
        assert post(conn, "/v1/generate", b'{"prompt": "ab"}')[1]["text"].startswith("ba [")
    finally:
        conn.close()
    # the service took its end: receipts arrived for the one handed connection
    deadline = time.monotonic() + 5
    while ready_service.channel.pending_receipts() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready_service.channel.pending_receipts() == 0
    assert ready_service.channel.problems == []


def test_ended_closes_that_attempts_connections(ready_service):
    idle = ready_service.hand("att-ended")
    other = ready_service.hand("att-other")
    try:
        time.sleep(0.2)
        ready_service.channel.ended("att-ended")
        assert idle.recv(1) == b""  # the service closed what was left of that attempt
        conn = EndpointHTTP(other)
        assert post(conn, "/v1/generate", b'{"prompt": "still"}')[0] == 200
    finally:
        idle.close()
        other.close()


# --- stopping --------------------------------------------------------------------------------


def test_stop_ends_the_daemon_and_its_markers(ready_service):
    pid = ready_service.channel.hello_pid
    r = ready_service.op("stop", timeout_s=20)
    assert r.rc == 0 and r.doc == {"ok": True, "escalated": False}
    assert host.group_pids(ready_service.pgid) == []
    assert not (ready_service.node.data / "model.pid").exists()
    assert not (ready_service.node.data / "model.ready").exists()
    assert ready_service.op("status").doc == {"running": False, "ready": False}
    # idempotent
    assert ready_service.op("stop").rc == 0
    assert pid is not None


def test_channel_eof_makes_the_daemon_exit(ready_service):
    ready_service.channel.close()
    deadline = time.monotonic() + 10
    while host.group_pids(ready_service.pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host.group_pids(ready_service.pgid) == []
    assert ready_service.op("status").doc == {"running": False, "ready": False}


# --- the runner ------------------------------------------------------------------------------


def run_job(svc: Service, payload: object, attempt: str = "att-job", connector: bool = True):
    return _run_job(svc, payload, attempt, connector)


def test_runner_sends_prompts_through_a_real_connector(ready_service):
    prompts = [f"prompt {i}" for i in range(10)]
    a = run_job(ready_service, {"prompts": prompts, "hold_s": 0.1})
    assert a.rc == 0, a.stderr
    assert a.result["envelope"] == 1
    texts = a.result["payload"]["texts"]
    assert len(texts) == 10 and texts[3].startswith("3 tpmorp [")
    assert a.result["provenance"] == {"service_pids": [ready_service.channel.hello_pid], "loads": 1}
    # request() keeps connections alive and reuses them: at most one per runner thread (8).
    assert 1 <= a.connects <= 8 and a.refusals == []
    assert not list(a.workdir.glob("result.json.tmp*"))


def test_golden_files_match_the_service(ready_service):
    for path in sorted((BUNDLE / "goldens").glob("*.json")):
        golden = json.loads(path.read_text())
        a = run_job(ready_service, golden["payload"], attempt=f"golden-{path.stem}")
        assert a.rc == 0, a.stderr
        assert a.result["payload"] == golden["expected"]["payload"], path.name


@pytest.mark.parametrize(
    ("payload", "detail"),
    [
        ([1], "payload must be a JSON object"),
        ({"prompts": []}, "non-empty list"),
        ({"prompts": ["a", 2]}, "payload.prompts[1] must be a string"),
        ({"prompts": ["a"], "hold_s": -1}, "hold_s must be a non-negative number"),
        ({"prompts": ["a"], "extra": 1}, "unknown payload key(s) ['extra']"),
    ],
)
def test_runner_bad_payload_is_a_job_fault(ready_service, payload, detail):
    a = run_job(ready_service, payload)
    assert a.rc == 2
    assert a.failure["fault"] == "job" and a.failure["reason"] == "bad_payload"
    assert detail in a.failure["detail"]
    assert a.connects == 0


def test_runner_refused_endpoint_is_transient(service):
    # Nothing started: the channel never said hello, so the connector refuses.
    a = run_job(service, {"prompts": ["a"]})
    assert a.rc == 75
    assert a.failure["fault"] == "transient"
    assert "service_unavailable" in a.failure["detail"]
    assert a.result is None


def test_runner_without_connector_names_the_variable(ready_service):
    a = run_job(ready_service, {"prompts": ["a"]}, connector=False)
    assert a.rc == 3
    assert a.failure["fault"] == "host"
    assert "OARBANK_SERVICE_MODEL is not set" in a.failure["detail"]


def test_runner_doctor():
    import subprocess

    out = subprocess.run([*RUNNER_ARGV, "doctor", "--json"], capture_output=True, text=True,
                         timeout=30, check=True)
    doc = json.loads(out.stdout)
    assert doctorform.form_problems(doc) == [] and doc["health"] == "healthy", doc
