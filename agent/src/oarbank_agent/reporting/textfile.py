"""``--metrics-textfile PATH``: this node's figures for node_exporter's textfile collector.

node_exporter reads every ``*.prom`` file of its ``--collector.textfile.directory`` on each
scrape; a half-written file would be read as garbage or lost figures, so the file is written
next to its final name and renamed over it (atomic on one filesystem). Mode 0644: the
collector usually runs as another user, and these are counts, not secrets.

Figures (gauges; the *_total ones only grow while this agent runs):
  oarbank_agent_jobs{state}                        jobs this agent knows, by state
  oarbank_agent_services{module,state}             service rows, by state (ready, starting,
                                                   stopped)
  oarbank_agent_attempts_total                     attempts started, over all known jobs
  oarbank_agent_sandbox_refusals_total{key}        network attempts the sandbox refused
  oarbank_agent_heartbeat_posts_total{result}      ok, failed
  oarbank_agent_heartbeat_refused_total            reports the portal refused or did not apply
Written by hand (no prometheus_client): the format is a few lines of text, and the agent keeps
its dependencies few.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

from oarbank_agent.platform import fileflags

__all__ = ["TextfileWriter", "render"]

log = logging.getLogger("oarbank_agent.reporting.textfile")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _state(row: dict[str, Any]) -> str:
    if row.get("running"):
        return "ready" if row.get("ready") else "starting"
    return "stopped"


def render(agent: Any) -> str:
    lines: list[str] = []

    def family(name: str, help_: str, samples: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in sorted(labels.items()))
            lines.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")

    node = {"node_id": agent.node.node_id}
    jobs = Counter(j.state for j in agent.jobs.values())
    family("oarbank_agent_jobs", "Jobs this agent knows, by state",
           [(node | {"state": k}, v) for k, v in sorted(jobs.items())])
    rows = [agent.supervisor.row(rt) for rt in agent.supervisor.services.values()]
    services = Counter((r["module"], _state(r)) for r in rows)
    family("oarbank_agent_services", "Service rows by module and state",
           [(node | {"module": m, "state": s}, v) for (m, s), v in sorted(services.items())])
    family("oarbank_agent_attempts_total", "Attempts started, over all known jobs",
           [(node, sum(j.attempts for j in agent.jobs.values()))])
    from oarbank_agent.sandbox import refusals

    family("oarbank_agent_sandbox_refusals_total", "Network attempts the sandbox refused",
           [(node | {"key": k}, v["count"]) for k, v in refusals.current().report().items()])
    hb = agent.heartbeat.status() if agent.heartbeat is not None else None
    if hb is not None:
        family("oarbank_agent_heartbeat_posts_total", "Heartbeat posts, by result",
               [(node | {"result": "ok"}, hb["posts_ok"]),
                (node | {"result": "failed"}, hb["posts_failed"])])
        family("oarbank_agent_heartbeat_refused_total", "Reports the portal refused or did "
               "not apply", [(node, sum(r["count"] for r in hb["refused"]))])
    return "\n".join(lines) + "\n"


def write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if fileflags.MODES_GUARD:  # (Windows has no modes: the folder's DACL decides)
            os.fchmod(fd, 0o644)  # the agent's umask is 077; the collector must read it
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


class TextfileWriter:
    def __init__(self, path: str, agent: Any, period_s: float) -> None:
        self.path = Path(path)
        self.agent = agent
        self.period_s = period_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="textfile")

    def write_now(self) -> None:
        try:
            write(self.path, render(self.agent))
        except Exception as e:  # figures are a convenience: never a reason to stop the agent
            log.warning("metrics textfile %s: not written: %s", self.path, e)

    async def _run(self) -> None:
        while True:
            self.write_now()
            await asyncio.sleep(self.period_s)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.write_now()  # the last figures (services stopped) stay for the collector
