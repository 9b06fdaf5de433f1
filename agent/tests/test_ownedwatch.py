"""Owned objects are reaped (issue 15, part 4; G6): a service's list_owned whenever an attempt
that reached it ends (and every service's every 60 s), destroy <id> --force for each object
whose attempt is over; objects the agent cannot prove over are left alone. The pure choice
first, then a real agent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

from agent_helpers import read_jsonl, write_module

from oarbank_agent.services.ownedwatch import DEBOUNCE_S, Reaper, to_destroy


def test_only_objects_of_attempts_that_are_over_are_destroyed() -> None:
    objects = [{"id": "done", "attempt": 3}, {"id": "live", "attempt": 4},
               {"id": "future", "attempt": 9}, {"id": "nameless"}, {"attempt": 2},
               {"id": "flag", "attempt": True}, {"id": "text", "attempt": "3"}, "junk"]
    assert to_destroy(objects, live={4}, last_given=5) == (["done"], None)
    assert to_destroy({"id": "x"}, set(), 5) == (
        [], "list_owned: 'objects' must be a list, got dict")


def test_pokes_within_the_debounce_fold_into_one_round() -> None:
    """The folding itself: six pokes 20 ms apart within a 0.5 s debounce are one round, a poke
    after it is another. (A supervisor without services stands in for the agent's, so a round costs
    nothing: with a real module each ``list_owned`` is a process start, and a slow start would
    fold the pokes by itself and hide a missing debounce; the test with the real agent is below.)
    """
    async def round_done(n: int, reaper: Reaper) -> int:
        # Without services a round has no await in it: once `rounds` reaches n the reaper is
        # back waiting, and only a poke since its round began (its event set) starts another
        # (the interval is an hour): so a clear event proves no further round is coming.
        deadline = asyncio.get_running_loop().time() + 30
        while reaper.rounds < n:
            assert asyncio.get_running_loop().time() < deadline, f"round {n} never ran"
            await asyncio.sleep(0.01)
        assert not reaper._wake.is_set(), "a poke during the debounce started another round"
        return reaper.rounds

    async def main() -> tuple[int, int, int]:
        sup = SimpleNamespace(services={}, shutting_down=False)
        reaper = Reaper(sup, lambda: (set(), 0), interval_s=3600, debounce_s=0.5)  # type: ignore[arg-type]
        reaper.start()
        try:
            for _ in range(6):
                reaper.poke({"m/echo"})
                await asyncio.sleep(0.02)  # the input: pokes 20 ms apart
            burst = await round_done(1, reaper)
            reaper.poke({"m/echo"})
            after = await round_done(2, reaper)
            reaper.poke(set())  # an attempt that reached no service: no round
            assert not reaper._wake.is_set(), "an empty poke woke the reaper"
            return burst, after, reaper.rounds
        finally:
            await reaper.aclose()

    assert asyncio.run(main()) == (1, 2, 2)


def test_objects_of_an_ended_attempt_are_destroyed_with_force(start_agent,
                                                             tmp_path: Path) -> None:
    agent = start_agent([write_module(tmp_path / "m")])
    first = agent.run_job("echo", {"requests": 1})
    wire = agent.wire_attempt(first["job_id"])
    owned = agent.module_data() / "owned.json"
    owned.write_text(json.dumps([{"id": "scratch-1", "attempt": wire},
                                 {"id": "not-yet", "attempt": wire + 1000},
                                 {"id": "whose"}]))
    agent.run_job("echo", {"requests": 1})  # an attempt ends: list_owned, then destroy

    def destroyed() -> list[dict]:
        return [e for e in read_jsonl(agent.module_data() / "events.jsonl")
                if e["event"] == "destroy"]

    agent.wait_for(lambda: destroyed(), timeout=60, what="a destroy")
    assert [(e["id"], e["force"]) for e in destroyed()] == [("scratch-1", True)]
    # The agent logs it once the destroy op has returned (the op records its event before it
    # rewrites owned.json: the file is read only after that).
    agent.wait_for(lambda: "destroyed owned object scratch-1 (its attempt is over)" in agent.log(),
                   timeout=30, what="the agent's log line for the destroy")
    assert [o["id"] for o in json.loads(owned.read_text())] == ["not-yet", "whose"]


def test_a_burst_of_attempt_ends_is_one_round_of_list_owned(start_agent, tmp_path: Path) -> None:
    """Attempts ending together fold into one reaping round (the reaper's short debounce),
    not a `list_owned` op each (each op is a process start)."""
    agent = start_agent([write_module(tmp_path / "m")])
    agent.run_job("echo", {"requests": 1})  # the service is up; its first round is done

    def listed_times() -> list[float]:
        """When each list_owned op began (its event is written as it begins)."""
        return [e["t"] for e in read_jsonl(agent.module_data() / "events.jsonl")
                if e["event"] == "op" and e["op"] == "list_owned"]

    def listed() -> int:
        return len(listed_times())

    agent.wait_for(lambda: listed() >= 1, timeout=30, what="the first round")
    before = listed()
    jobs = [agent.submit("echo", {"requests": 1}) for _ in range(6)]
    for j in jobs:
        assert agent.wait(j)["state"] == "succeeded"
    agent.wait_for(lambda: listed() > before, timeout=30, what="a round after the burst")
    # A marker attempt that reaches the service, after the burst: rounds run one after the
    # other, so once one begins after the marker's end every round the burst caused has begun
    # (a burst poke still in its debounce then folds into the marker's round, as it should).
    marker = agent.run_job("echo", {"requests": 1})["job_id"]
    rows = {j["job_id"]: j for j in agent.status()["jobs"]}
    marker_end = rows[marker]["finished_at"]
    agent.wait_for(lambda: any(t > marker_end for t in listed_times()[before:]),
                   timeout=30, what="the marker's round")
    ends = sorted(rows[j]["finished_at"] for j in jobs)
    spread = ends[-1] - ends[0]
    rounds = sum(1 for t in listed_times()[before:] if t < marker_end)
    # Six ends within one debounce are one round (a second one only for ends after it began).
    assert rounds <= 2 + int(spread / DEBOUNCE_S), (rounds, spread)


def test_only_the_services_an_ended_attempt_reached_are_asked(start_agent,
                                                              tmp_path: Path) -> None:
    """An attempt that never connected to the service (a stage without it, or one that made no
    connection) asks it nothing when it ends: the service cannot have made an object for an
    attempt number it never saw. One that connected does."""
    agent = start_agent([write_module(tmp_path / "m")])
    agent.run_job("echo", {"requests": 1})

    def listed_times() -> list[float]:
        """When each list_owned op began (its event is written as it begins)."""
        return [e["t"] for e in read_jsonl(agent.module_data() / "events.jsonl")
                if e["event"] == "op" and e["op"] == "list_owned"]

    # The first job's end caused one round, of one op (one service): once it began, nothing
    # else is due (no other attempt ended).
    agent.wait_for(lambda: len(listed_times()) >= 1, timeout=30,
                   what="the round after the first job")
    before = len(listed_times())
    for stage, payload in (("plain", {}), ("echo", {}), ("plain", {})):
        assert agent.run_job(stage, payload)["state"] == "succeeded"
    # A marker attempt that connects, and runs DEBOUNCE_S + 1 s after its connection (the
    # window): a round those three caused would begin DEBOUNCE_S after their ends, before the
    # marker's end, and not fold into the marker's round. Rounds run one after the other, so
    # once the marker's round begins every earlier one has begun.
    marker = agent.run_job("echo", {"requests": 1, "sleep_s": DEBOUNCE_S + 1.0})
    assert marker["state"] == "succeeded"
    marker_end = next(j["finished_at"] for j in agent.status()["jobs"]
                      if j["job_id"] == marker["job_id"])
    agent.wait_for(lambda: any(t > marker_end for t in listed_times()[before:]),
                   timeout=30, what="the round after an attempt that connected")
    assert [t for t in listed_times()[before:] if t < marker_end] == [], \
        "attempts that reached no service caused a list_owned"
