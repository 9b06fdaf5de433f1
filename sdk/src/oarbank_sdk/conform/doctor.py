"""The kit's ``runner doctor`` check: ``<runner.exec...> doctor --json`` run as an agent runs it
(the runner's environment and sandbox, cwd the module's data directory, its own process group,
within 60 s: contract section 4) must print the contract's answer and exit 0, unhealthy or not.

``FAIL``: no JSON object, a non-zero exit, no answer in time, or an answer that is not the
contract's form (each problem named, ``oarbank_sdk.doctorform``). ``warn``: the older
``{"ok": bool}`` form, which agents still take but is not the contract's. ``ok`` names the
health it said (and the failed checks of an unhealthy or undetected answer).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

from oarbank_sdk import doctorform
from oarbank_sdk import manifest as _manifest
from oarbank_sdk._opdoc import last_json_object
from oarbank_sdk.conform import host
from oarbank_sdk.conform.report import FAIL, OK, SKIP, WARN, Report

__all__ = ["check_doctor", "judge_answer"]

NAME = "runner doctor"


def judge_answer(rc: int | None, out: str, timeout_s: float) -> tuple[str, str]:
    """(status, detail) for how ``doctor --json`` ended (pure)."""
    if rc is None:
        return FAIL, f"did not finish within {timeout_s:g} s"
    doc = last_json_object(out)
    if doc is None:
        return FAIL, f"printed no JSON object (exit {rc}); it must print one and exit 0"
    if rc != 0:
        return FAIL, f"exit {rc}: it must exit 0 even when unhealthy ({json.dumps(doc)[:160]})"
    if doctorform.is_older_form(doc):
        return WARN, ('answered the older {"ok": ...} form; the contract\'s is '
                      '{"runner_protocol": {"supported": [1]}, "health": ..., "capabilities": '
                      '[...], "checks"?: [...]}')
    problems = doctorform.form_problems(doc)
    if problems:
        return FAIL, "; ".join(problems)
    failed = doctorform.failed_checks(doc)
    return OK, f"{doc['health']}" + (f" ({'; '.join(failed)})" if failed else "")


def check_doctor(m: _manifest.Manifest, node: host.NodeDirs,
                 wrap: Callable[..., list[str]], gpu: bool, report: Report,
                 timeout_s: float = doctorform.TIMEOUT_S) -> None:
    if m.runner is None:
        report.add(SKIP, NAME, "no [runner]")
        return
    work = node.attempt_dir("conform-doctor")
    argv = wrap(node.expand(m.runner.exec, m.bundle),
                read=[m.bundle, node.settings_file, node.data, *node.env_reads], write=[work],
                gpu=gpu)
    env = host.runner_env(node, "conform-doctor", work, {}, {}, dict(m.runner.env))
    proc = host.spawn([*argv, "doctor", "--json"], cwd=str(node.data), env=env,
                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    rc: int | None
    try:
        out, err = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc, out, err = None, b"", b""
    host.end_group(proc.pid)  # what the doctor left goes with it
    if proc.poll() is None:
        proc.kill()
    proc.communicate()
    status, detail = judge_answer(rc, out.decode("utf-8", errors="replace"), timeout_s)
    if status == FAIL and err.strip():
        detail += " | stderr: " + err.decode("utf-8", errors="replace").strip()[-200:]
    report.add(status, NAME, detail)
