"""The agent's answers on its control socket (control.py carries them): ``submit``, ``wait``,
``job``, ``status``, ``module`` (the module table's), ``drain``, ``reload``, ``protect``. A
request that cannot be answered raises ``control.ControlError`` with the contract's code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from oarbank_agent import eventwait
from oarbank_agent.jobs import machine as jobs
from oarbank_agent.operate import control
from oarbank_agent.protection import hostrules

if TYPE_CHECKING:
    from pathlib import Path

    from oarbank_agent.jobs.queue import JobQueue
    from oarbank_agent.jobs.store import JobRecord
    from oarbank_agent.modules.table import ModuleTable
    from oarbank_agent.protection.guard import Action, Guard
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["Answering", "answer"]


class Answering(Protocol):
    """What answering reads and asks of the agent (the agent is one)."""

    config: Any  # its AgentConfig (drain_s)
    jobs: dict[str, JobRecord]
    queue: JobQueue
    table: ModuleTable
    guard: Guard
    supervisor: Supervisor
    state_dir: Path

    def stopping(self) -> bool: ...
    def submit(self, module: str, stage: str, payload: dict[str, Any]) -> JobRecord: ...
    def job_view(self, rec: JobRecord, view: dict[str, Any]) -> dict[str, Any]: ...
    def status(self, jobs_limit: int | None = None, jobs_page: int = 1) -> dict[str, Any]: ...
    def request_stop(self, why: str = "stop") -> None: ...
    async def reload(self) -> list[str]: ...
    def protect(self, actions: list[Action]) -> None: ...


async def answer(agent: Answering, req: dict[str, Any]) -> dict[str, Any]:
    op = req.get("op")
    if op == "submit":
        if agent.stopping():
            raise control.ControlError("shutting_down", "the agent is stopping")
        module, stage, payload = req.get("module"), req.get("stage"), req.get("payload")
        if not isinstance(module, str) or not isinstance(stage, str):
            raise control.ControlError("bad_request", "submit needs 'module' and 'stage'")
        if not isinstance(payload, dict):
            raise control.ControlError("bad_request", "'payload' must be a JSON object")
        rec = agent.submit(module, stage, payload)
        return {"ok": True, "job_id": rec.job_id}
    if op in ("wait", "job"):
        rec = _job(agent, req.get("job_id"))
        if op == "wait" and rec.state not in jobs.TERMINAL:
            timeout = req.get("timeout")
            if timeout is not None and (not isinstance(timeout, (int, float))
                                        or isinstance(timeout, bool) or timeout < 0):
                raise control.ControlError("bad_request", "'timeout' must be seconds >= 0")
            fut = agent.queue.runs.when_final(rec.job_id)
            finished, _ = await eventwait.result_within(fut, timeout)
            if not finished:
                view = _with_events(rec, agent.job_view(rec, rec.public()))
                why = f"; {view['reason']}" if view.get("reason") else ""
                return {"ok": False, "code": "timeout", "job": view,
                        "error": f"job {rec.job_id} not finished after {timeout:g}s "
                                 f"(state: {rec.state}{why})"}
        return {"ok": True, "job": _with_events(rec, agent.job_view(rec, rec.public()))}
    if op == "status":
        limit, page = req.get("jobs_limit"), req.get("jobs_page", 1)
        for name, v in (("jobs_limit", limit), ("jobs_page", page)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise control.ControlError("bad_request", f"'{name}' must be an integer >= 1")
        return {"ok": True, "status": agent.status(limit, page)}
    if op == "module":
        return await agent.table.request(req)
    if op == "drain":
        agent.request_stop("drain request")
        return {"ok": True, "draining": True, "drain_s": agent.config.drain_s}
    if op == "reload":
        return {"ok": True, "changes": await agent.reload()}
    if op == "protect":
        rule = req.get("rule")
        if rule is not None:
            try:
                actions = agent.guard.set_rule(str(rule))
            except ValueError as exc:
                raise control.ControlError("bad_request", str(exc)) from None
            hostrules.write(agent.state_dir, agent.guard.rules())  # kept across restarts
            agent.protect(actions)
        return {"ok": True, "rules": agent.guard.rules(),
                "held": {k: rt.held for k, rt in agent.supervisor.services.items()
                         if rt.held is not None}}
    raise control.ControlError("bad_request", f"unknown op {op!r}")


def _job(agent: Answering, job_id: Any) -> JobRecord:
    if not isinstance(job_id, str) or job_id not in agent.jobs:
        raise control.ControlError("unknown_job", f"no job {job_id!r}")
    return agent.jobs[job_id]


def _with_events(rec: JobRecord, view: dict[str, Any]) -> dict[str, Any]:
    """A job's view with the events its runner emitted in its latest attempt that has some
    (--events; runnerevents.py), as kept in its history."""
    for h in reversed(rec.history):
        if "events" in h:
            view["events"] = {k: h[k] for k in h if k.startswith("events")}
            view["events"]["attempt_id"] = h.get("attempt_id")
            break
    return view
