"""`oarbank-portal jobs submit / status / cancel` against a real portal process: the real CLI in
its own process, over HTTP. Nodes are played by the test (claims and results posted as an agent
would; the agent's side is built elsewhere)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from dispatch_helpers import MODULE_ID, Node, offer, submitter_token


def jobs_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_ui.cli", "jobs", *args],
                          capture_output=True, text=True, timeout=timeout)


def play(nodes: list[Node], stop: threading.Event, fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Nodes claiming and finishing work until ``stop``: a job whose prompt is in ``fail``
    fails."""
    while not stop.is_set():
        for n in nodes:
            for g in n.claim(offer(free=2), wait_s=0.5):
                state = "failed" if g["payload"]["prompt"] in fail else "succeeded"
                assert n.result(g, state).status == 200


def setup(start_portal: Any, tmp_path: Path, lines: list[str]) -> tuple[Any, list[str]]:
    p = start_portal()
    token = tmp_path / "alice.token"
    token.write_text(submitter_token(p.db, "alice") + "\n")
    token.chmod(0o600)
    payloads = tmp_path / "payloads.jsonl"
    payloads.write_text("".join(line + "\n" for line in lines))
    return p, ["--portal", p.url, "--token-file", str(token)]


def test_submit_wait_out_exits_0_when_every_job_succeeded(start_portal: Any,
                                                          tmp_path: Path) -> None:
    lines = [json.dumps({"prompt": f"p{i}"}) for i in range(12)]
    p, common = setup(start_portal, tmp_path, lines[:6] + [""] + lines[6:])
    stop = threading.Event()
    nodes = [Node(p, "n1"), Node(p, "n2")]
    t = threading.Thread(target=play, args=(nodes, stop))
    t.start()
    try:
        out = tmp_path / "results.jsonl"
        r = jobs_cli("submit", *common, "--module", "modelserver", "--stage", "generate",
                     "--file", str(tmp_path / "payloads.jsonl"), "--wait", "--out", str(out),
                     "--poll-s", "0.3")
    finally:
        stop.set()
        t.join(30)
    assert r.returncode == 0, r.stderr
    printed = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(printed) == 12 and len({x["job_id"] for x in printed}) == 12
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["payload"]["prompt"] for x in records] == [f"p{i}" for i in range(12)]
    assert {x["state"] for x in records} == {"succeeded"}
    assert {x["module"] for x in records} == {MODULE_ID}
    assert "all jobs" in r.stderr and "12 succeeded, 0 failed" in r.stderr
    assert {x["node_id"] for x in records} <= {"n1", "n2"}
    # status of one job and of the batch, from the same CLI
    st = jobs_cli("status", *common, printed[0]["job_id"], "--batch", printed[0]["batch_id"])
    docs = [json.loads(x) for x in st.stdout.splitlines()]
    assert st.returncode == 0 and docs[0]["states"]["succeeded"] == 12
    assert docs[1]["job_id"] == printed[0]["job_id"] and docs[1]["state"] == "succeeded"


def test_submit_wait_exits_1_when_a_job_failed(start_portal: Any, tmp_path: Path) -> None:
    p, common = setup(start_portal, tmp_path, [json.dumps({"prompt": x}) for x in "abc"])
    stop = threading.Event()
    t = threading.Thread(target=play, args=([Node(p, "n1")], stop, {"b"}))
    t.start()
    try:
        out = tmp_path / "results.jsonl"
        r = jobs_cli("submit", *common, "--module", MODULE_ID, "--stage", "generate",
                     "--file", str(tmp_path / "payloads.jsonl"), "--wait", "--out", str(out),
                     "--poll-s", "0.3")
    finally:
        stop.set()
        t.join(30)
    assert r.returncode == 1, r.stderr
    assert "2 succeeded, 1 failed" in r.stderr
    states = [json.loads(x)["state"] for x in out.read_text().splitlines()]
    assert states == ["succeeded", "failed", "succeeded"]


def test_a_bad_line_is_named_and_nothing_is_submitted(start_portal: Any,
                                                      tmp_path: Path) -> None:
    p, common = setup(start_portal, tmp_path, ['{"prompt": "a"}', '["no"]'])
    r = jobs_cli("submit", *common, "--module", MODULE_ID, "--stage", "generate", "--file",
                 str(tmp_path / "payloads.jsonl"))
    assert r.returncode == 2 and "payloads.jsonl:2: a payload is a JSON object" in r.stderr
    r = jobs_cli("submit", *common, "--module", MODULE_ID, "--stage", "train", "--file",
                 str(tmp_path / "payloads.jsonl").replace("payloads", "none"))
    assert r.returncode == 2 and "none.jsonl" in r.stderr
    (tmp_path / "ok.jsonl").write_text('{"prompt": "a"}\n')
    r = jobs_cli("submit", *common, "--module", MODULE_ID, "--stage", "train", "--file",
                 str(tmp_path / "ok.jsonl"))
    assert r.returncode == 2 and "ok.jsonl:1: refused: 400 bad_request (jobs[0].stage)" \
        in r.stderr, r.stderr
    assert Node(p, "n1").claim() == []


def test_cancel_from_the_cli(start_portal: Any, tmp_path: Path) -> None:
    p, common = setup(start_portal, tmp_path, ['{"prompt": "a"}', '{"prompt": "b"}'])
    r = jobs_cli("submit", *common, "--module", MODULE_ID, "--stage", "generate", "--file",
                 str(tmp_path / "payloads.jsonl"))
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout.splitlines()[0])
    c = jobs_cli("cancel", *common, first["job_id"])
    assert c.returncode == 0 and json.loads(c.stdout)["state"] == "cancelled"
    again = jobs_cli("cancel", *common, first["job_id"])
    assert again.returncode == 1 and "409 job_done" in again.stderr
    b = jobs_cli("cancel", *common, "--batch", first["batch_id"])
    assert json.loads(b.stdout) == {"cancelled": 1}

