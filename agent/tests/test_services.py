"""Warm services through a real agent: sharing, readiness before runners, refusals, `ended`,
idle stop, failures and withdrawal, descriptor hygiene."""

from __future__ import annotations

from pathlib import Path

from agent_helpers import EXAMPLE, read_jsonl, write_module


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = cur = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def test_eight_jobs_share_one_warm_model_with_four_tokens(start_agent) -> None:
    agent = start_agent([EXAMPLE], {"modelserver": {"load_s": 0.5, "slots": 4}})
    ids = [agent.submit("generate", {"prompts": [f"p{i}", "q"], "hold_s": 0.4},
                        module="modelserver") for i in range(8)]
    jobs = [agent.wait(j) for j in ids]
    assert [j["state"] for j in jobs] == ["succeeded"] * 8, jobs
    loads = (agent.module_data("dev.example.modelserver") / "model.loads").read_text().split()
    assert len(loads) == 1
    pids = {p for j in jobs for p in j["result"]["provenance"]["service_pids"]}
    assert pids == {int(loads[0])}
    # At most 4 at the same moment: the agent's attempt times bracket each runner process.
    status = {j["job_id"]: j for j in agent.status()["jobs"]}
    assert max_overlap([(status[i]["started_at"], status[i]["finished_at"]) for i in ids]) <= 4


def test_runners_record_at_most_four_concurrent(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    agent = start_agent([mod], {"echo": {"slots": 4, "load_s": 0.3}})
    ids = [agent.submit("echo", {"requests": 1, "sleep_s": 0.3}) for _ in range(8)]
    assert all(agent.wait(j)["state"] == "succeeded" for j in ids)
    runs = read_jsonl(agent.module_data() / "runs.jsonl")
    start = {r["attempt"]: r["t"] for r in runs if r["event"] == "start"}
    end = {r["attempt"]: r["t"] for r in runs if r["event"] == "end"}
    assert len(start) == 8
    assert max_overlap([(start[a], end[a]) for a in start]) == 4


def test_no_runner_before_ready_and_hello(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module], {"echo": {"load_s": 0.5}})
    ids = [agent.submit("echo", {"requests": 1}) for _ in range(3)]
    assert all(agent.wait(j)["state"] == "succeeded" for j in ids)
    events = read_jsonl(agent.module_data() / "events.jsonl")
    hello = [e["t"] for e in events if e["event"] == "hello"]
    ready = [e["t"] for e in events if e["event"] == "ready"]
    # An op's "answer" is recorded after it read the daemon's marker: an op that started
    # before the daemon was ready may still answer true, so its start time proves nothing.
    ready_true = [e["t"] for e in events
                  if e["event"] == "answer" and e["op"] == "ready" and e["ready"]]
    assert len(hello) == len(ready) == 1
    starts = [r["t"] for r in read_jsonl(agent.module_data() / "runs.jsonl")
              if r["event"] == "start"]
    assert len(starts) == 3
    # The ready op that answered true ran after the daemon marked itself ready.
    assert ready_true and min(ready_true) >= ready[0]
    assert min(starts) > max(hello[0], ready[0], min(ready_true))


def test_unknown_op_and_rate_limit_through_a_real_runner(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module])
    job = agent.run_job("echo", {"bad_op": True, "burst": 100, "rate_window_s": 2.0})
    assert job["state"] == "succeeded", job
    out = job["result"]["payload"]
    assert out["bad_op"]["ok"] is False and out["bad_op"]["error"] == "bad_request"
    outcomes = out["burst"]["outcomes"]
    assert set(outcomes) == {"ok", "rate_limited"}
    # 64 immediate connects pass; the bucket refills at 32/s while the burst itself runs
    # (each connect is a round trip), so the first refusal comes at 65 plus that refill.
    first_refusal = outcomes.index("rate_limited")
    refill = int(out["burst"]["burst_s"] * 32) + 1
    assert 64 <= first_refusal <= 64 + refill, (first_refusal, out["burst"]["burst_s"])
    # Then about 32 a second: 2 s of trying gets roughly 64 through, far fewer than a burst.
    assert 40 <= out["burst"]["ok_after"] <= 90, out["burst"]


def test_ended_reaches_the_service_after_the_attempt(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module])
    job = agent.run_job("echo", {"requests": 3, "keep_open": True})
    plain = agent.run_job("plain", {})
    assert job["state"] == plain["state"] == "succeeded"
    attempt = f"{job['job_id']}.1"
    # The service sees the attempt as an integer (contract section 3); status maps it back.
    wire = agent.wire_attempt(job["job_id"])
    agent.wait_for(lambda: any(e["event"] == "ended" for e in
                               read_jsonl(agent.module_data() / "events.jsonl")), what="ended")
    events = read_jsonl(agent.module_data() / "events.jsonl")
    ended = [e for e in events if e["event"] == "ended"]
    assert [e["attempt"] for e in ended] == [wire]  # the plain job reached no service
    assert ended[0]["connections"] == 3 and ended[0]["open_after"] == 0
    conns = [e for e in events if e["event"] == "connection" and e["attempt"] == wire]
    assert len(conns) == 3
    runner_end = next(r["t"] for r in read_jsonl(agent.module_data() / "runs.jsonl")
                      if r["event"] == "end" and r["attempt"] == attempt)
    assert ended[0]["t"] > runner_end


def test_idle_stop_and_restart_on_demand(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"idle_timeout_s": 0.5})
    agent = start_agent([mod])
    assert agent.service_row()["running"] is False
    assert agent.run_job("echo", {"requests": 1})["state"] == "succeeded"
    agent.wait_for(lambda: not agent.service_row()["running"], what="idle stop")
    row = agent.service_row()
    assert row["users"] == 0 and row["ready"] is False and row["error"] is None
    events = read_jsonl(agent.module_data() / "events.jsonl")
    assert [e["op"] for e in events if e["event"] == "op" and e["op"] in ("start", "stop")] == \
        ["start", "stop"]
    # The next job starts it again.
    again = agent.run_job("echo", {"requests": 1})
    assert again["state"] == "succeeded"
    assert len((agent.module_data() / "loads").read_text().split()) == 2


def test_always_service_starts_with_the_agent(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"lifecycle": "always", "idle_timeout_s": 0.2})
    # The window: an on_demand service with the same idle_timeout_s, idle since after the
    # always one became ready; once it has been idle-stopped, the always one's idle time
    # has passed too.
    witness = write_module(tmp_path / "w", module_id="test.agent.witness",
                           service={"idle_timeout_s": 0.2})
    agent = start_agent([mod, witness])

    def row(module: str) -> dict:
        return next(r for r in agent.status()["services"] if r["module"] == module)

    agent.wait_for(lambda: row("test.agent.echo")["ready"], what="always service ready")
    assert agent.run_job("echo", {"requests": 1}, module="witness")["state"] == "succeeded"
    agent.wait_for(lambda: row("test.agent.witness")["last_stop_reason"] == "idle",
                   what="the on_demand service idle-stopped")
    assert row("test.agent.echo")["ready"] is True
    ops = [e["op"] for e in read_jsonl(agent.module_data() / "events.jsonl") if e["event"] == "op"]
    assert "stop" not in ops, ops


def test_failing_service_backs_off_then_is_withdrawn(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={
        "restart": {"backoff_initial_s": 0.1, "backoff_max_s": 0.2, "max_failures": 3}})
    agent = start_agent([mod], {"echo": {"start_fail": True}})
    job = agent.submit("echo", {"requests": 1})
    agent.wait_for(lambda: agent.service_row()["withdrawn"], what="withdrawal")
    row = agent.service_row()
    assert row["withdrawn"] is True and "start exited with 1" in row["error"]
    # The job is not failed: it waits, saying why (test_faults.py follows it to the end).
    rec = next(j for j in agent.status()["jobs"] if j["job_id"] == job)
    assert rec["state"] == "queued" and rec["attempts"] == 0, rec
    starts = [e["t"] for e in read_jsonl(agent.module_data() / "events.jsonl")
              if e["event"] == "op" and e["op"] == "start"]
    assert len(starts) >= 3  # later ones: a healthy fingerprint un-withdraws it for one try
    # backoff 0.1 s, then 0.2 s (capped): the gaps grow
    assert starts[1] - starts[0] >= 0.1 and starts[2] - starts[1] >= 0.2


def test_service_closing_its_channel_is_restarted(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={
        "restart": {"backoff_initial_s": 0.1, "backoff_max_s": 1, "max_failures": 5}})
    # The daemon exits once its first user's attempt has ended: no race with a slow runner start.
    agent = start_agent([mod], {"echo": {"die_after_ended": 1}})
    first = agent.run_job("echo", {"requests": 1})
    assert first["state"] == "succeeded"
    agent.wait_for(lambda: "ready -> backoff (failed): the service closed its channel"
                   in agent.log(), what="the closed channel counted as a failure")
    # The next user gets a new daemon.
    assert agent.run_job("echo", {"requests": 1})["state"] == "succeeded"
    hellos = [e["pid"] for e in read_jsonl(agent.module_data() / "events.jsonl")
              if e["event"] == "hello"]
    assert len(set(hellos)) == len(hellos) >= 2  # a new daemon each time


def test_descriptor_count_returns_to_baseline(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"idle_timeout_s": 0.3})
    agent = start_agent([mod])
    before = agent.settled_fds()
    ids = [agent.submit("echo", {"requests": 4, "keep_open": i % 2 == 0}) for i in range(6)]
    ids += [agent.submit("plain", {}) for _ in range(2)]
    assert all(agent.wait(j)["state"] == "succeeded" for j in ids)
    agent.wait_for(lambda: not agent.service_row()["running"], what="idle stop")
    agent.wait_fds_back(before, timeout=10)
