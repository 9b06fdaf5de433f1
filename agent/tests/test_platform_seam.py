"""The platform seam holds: outside ``oarbank_agent/platform/`` no module of the agent names
what only an operating system knows (design: "Platforms behind one seam").

The check is textual on purpose: a comment that explains a pgid outside the backend is the
first step of code that uses one. A failure names every file and line, and the name found.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "oarbank_agent"
BACKENDS = ("platform",)

# Each name, and why only a backend may say it.
FORBIDDEN = {
    r"pgid|killpg": "process groups are the backend's Group",
    r"cgroup": "limits and containment are the backend's",
    r"/proc\b": "the process table is the backend's",
    r"pidfd": "waiting for a process is the backend's",
    r"\bflock\b|\bfcntl\b": "the state-dir lock and descriptor flags are the backend's",
    r"\bprctl\b": "process attributes are the backend's",
    r"add_reader|add_writer|remove_reader|remove_writer": "readiness I/O is the backend's (the "
                                                          "Windows proactor loop has none)",
    r"AF_UNIX|start_unix_server|open_unix_connection": "the control endpoint and streams are "
                                                       "the backend's",
    r"\bSIG(?:[A-Z]{2,}\d*|RTMIN|RTMAX)\b|add_signal_handler": "stop and reload requests, and "
                                                               "ending a group, are the backend's",
}
PATTERN = re.compile("|".join(f"(?P<n{i}>{p})" for i, p in enumerate(FORBIDDEN)))
WHY = list(FORBIDDEN.values())


def seam_breaks(package: Path, backends: tuple[str, ...] = BACKENDS) -> list[str]:
    """``path:line: name (why)`` for each forbidden name outside the backends."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in backends:
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in PATTERN.finditer(line):
                why = WHY[int(m.lastgroup[1:])]  # type: ignore[index]
                found.append(f"oarbank_agent/{rel.as_posix()}:{lineno}: {m.group(0)!r} ({why})")
    return found


def test_nothing_outside_the_backends_names_what_only_an_os_knows() -> None:
    found = seam_breaks(PACKAGE)
    assert not found, f"{len(found)} names outside platform/:\n" + "\n".join(found)


def test_the_check_names_file_line_and_name(tmp_path: Path) -> None:
    (tmp_path / "platform").mkdir()
    (tmp_path / "platform" / "ok.py").write_text("os.killpg(pgid, signal.SIGTERM)\n")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "bad.py").write_text("x = 1\nloop.add_reader(fd, cb)  # /proc/self\n")
    found = seam_breaks(tmp_path)
    assert len(found) == 2
    assert found[0].startswith("oarbank_agent/jobs/bad.py:2: 'add_reader' (readiness I/O")
    assert found[1].startswith("oarbank_agent/jobs/bad.py:2: '/proc' (the process table")
