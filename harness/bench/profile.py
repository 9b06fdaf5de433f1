"""Where the agent's time goes, per figure: a summary of py-spy's collapsed stacks (pure).

``--profile DIR`` records the bench's agent with py-spy once per figure (``DIR/<figure>-
bench-agent.txt``; a figure's own agents: ``DIR/<figure>-*.txt``; ``--gil``: only samples
holding the GIL, the agents' own Python CPU).
``summarize`` turns one file into the few lines the report prints under a figure that missed
a target: how much CPU was sampled, the functions it was spent in (self) and the agent's own
functions it was spent under (inclusive, the event loop's frames left out).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["summarize", "lines"]

# Frames every sample has (the interpreter, asyncio's loop, the agent's main): no information.
_ALWAYS = ("<module>", "_run_module_as_main", "_run_code", "asyncio/", "run_cli.py",
           "operate/cli.py", "posix/loops.py", "__main__.py")


def summarize(paths: list[Path], rate: float, top: int = 8) -> dict[str, Any]:
    """{"samples", "cpu_s", "self": [[frame, share]], "inclusive": [[frame, share]]}, over
    every file of ``paths`` (the agents of one figure) together."""
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    total = 0
    text = "\n".join(p.read_text(errors="replace") for p in paths if p.exists())
    for row in text.splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            if "oarbank" in f and not any(a in f for a in _ALWAYS):
                under[f] += n

    def share(c: Counter[str]) -> list[list[Any]]:
        return [[f, round(n / total, 3)] for f, n in c.most_common(top)] if total else []

    return {"samples": total, "cpu_s": round(total / rate, 3), "self": share(own),
            "inclusive": share(under)}


def lines(figure: str, summary: dict[str, Any]) -> list[str]:
    """The report's lines for one figure."""
    out = [f"{figure}: the agent's Python CPU while it ran, {summary['cpu_s']:.2f} s "
           f"({summary['samples']} samples)"]
    for title, key in (("in", "self"), ("under", "inclusive")):
        for frame, part in summary[key]:
            out.append(f"  {part * 100:5.1f} % {title} {frame}")
    return out
