"""Running one service op: ``<exec...> <op>`` (contract section 2).

cwd = the bundle, its own process group (session), the exact op environment and nothing else,
stdout to a file (a daemon left by ``start`` may keep it open, so we never wait for EOF on a
pipe), the document = stdout's last line that parses as a JSON object, exit 0 = success.
Only ``advice.OP_STDOUT_MAX`` (1 MiB) of stdout is read: an op that printed more failed, and
says how much it printed (a runaway op never costs the agent its memory).

stderr: a failed op's error ends with its last meaningful stderr line (``logtail``: bounded
read, at most 300 characters), e.g. ``start exited with 1: FileNotFoundError: weights
missing``. Every op's stderr ends up in ``logs/<service>.log`` (``servicelog.py``: rotated by
size). ``start`` writes into a pipe the agent reads into that log (the daemon it leaves
inherits it and keeps writing there; this op's part is what came through before it exited:
nothing else of the service runs during a start). Other ops write to a file of their own in
``run/ops`` (so a daemon writing to the log at the same time cannot be mistaken for the op),
appended to the log (at most ``LOG_COPY_MAX`` bytes, the end kept) once the op is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oarbank_agent import procs
from oarbank_agent.eventwait import result_within
from oarbank_agent.modules.loaded import ModuleCtx, NodeInfo
from oarbank_agent.platform.api import Group
from oarbank_agent.sandbox import policy as sandboxing
from oarbank_agent.services import servicelog
from oarbank_sdk import advice, logtail
from oarbank_sdk.protocol import last_json_object

__all__ = ["OP_TIMEOUTS", "OpResult", "run_op"]

log = logging.getLogger("oarbank_agent.services.ops")

# Fixed op timeouts (seconds); start and stop use the service's own bounds.
OP_TIMEOUTS = {"fingerprint": 5.0, "status": 5.0, "ready": 5.0, "list_owned": 5.0,
               "destroy": 60.0}

# An op's process is waited for this long once its group was ended: one that outlives its kill
# (stuck in the kernel; seen under Wine) must not hold the start, or the agent, for ever.
REAP_WAIT_S = 5.0
LOG_COPY_MAX = 1 << 20  # bytes of one op's own stderr file copied into the service log


@dataclass
class OpResult:
    op: str
    ok: bool
    rc: int | None  # None: timed out or never started
    doc: dict[str, Any] | None
    error: str | None  # readable, when not ok
    group: Group | None  # the op's group (a start's: where its daemon lives)


async def run_op(ctx: ModuleCtx, node: NodeInfo, service: str, op: str, *,
                 timeout_s: float, registry: procs.ProcessRegistry,
                 extra_env: dict[str, str] | None = None, inherit: tuple[int, ...] = (),
                 after_spawn: Callable[[], None] | None = None,
                 keep_group: bool = False, args: tuple[str, ...] = ()) -> OpResult:
    """Run one op and return what it said. Never raises for the op's own failures.

    ``inherit``: handles the op's process gets (the ``start`` op: its channel's child end).

    ``after_spawn`` runs right after the fork attempt (also when it failed), so the caller can
    close descriptors meant only for the child. With ``keep_group`` (the ``start`` op) the
    group is left running (the daemon lives in it) unless the op failed; otherwise anything the
    op left behind is ended with it.
    """
    svc = ctx.manifest.service(service)
    assert svc is not None, service
    argv = ctx.exec_argv(svc.exec) + [op, *args]
    env = ctx.op_env(node, service)
    env.update(extra_env or {})
    out_dir = node.state_dir / "run" / "ops"
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / f"{os.getpid()}-{id(argv):x}-{service}-{op}.out"
    label = f"{ctx.id}/{service} {op}"
    log_path = ctx.log_dir / f"{service}.log"
    # start: a pipe into the service log (its daemon inherits it); others: a file of their own.
    err_path = log_path if keep_group else out_path.with_suffix(".err")
    slog = servicelog.get(log_path)
    with contextlib.ExitStack() as files:
        out = files.enter_context(open(out_path, "wb"))
        if keep_group:
            err: Any = slog.open_writer()
            files.callback(os.close, err)  # the child has its copy once spawned
            err_start = slog.mark()  # where this op's stderr begins (a launcher refusal too)
        else:
            err = files.enter_context(open(err_path, "ab"))
            err_start = 0
        try:
            proc = await procs.spawn(argv, env=env, cwd=ctx.manifest.bundle, stdout=out,
                                     stderr=err, inherit=inherit, registry=registry,
                                     kind="service" if keep_group else "op", label=label,
                                     walls=sandboxing.service_walls(ctx, node),
                                     refusal_key=f"{ctx.id}/{service}")
        except OSError as exc:
            if after_spawn:
                after_spawn()
            out_path.unlink(missing_ok=True)
            _file_err(err_path, log_path, err_start)
            return OpResult(op, False, None, None, f"{op}: cannot run {argv[0]}: {exc}", None)
    if after_spawn:
        after_spawn()
    group = procs.group_of(proc)
    rc: int | None
    try:
        # Not wait_for: on Python < 3.12 it may swallow a cancel that comes in the turn the op
        # exits (eventwait.py), and a cancelled `ready` poll would go on polling for ever.
        _, rc = await result_within(proc.wait(), timeout_s)
    except asyncio.CancelledError:
        await _end(registry, group)
        await _reaped(proc, label)
        out_path.unlink(missing_ok=True)
        _file_err(err_path, log_path)
        raise
    printed, text = _read_bounded(out_path, advice.OP_STDOUT_MAX)
    out_path.unlink(missing_ok=True)
    doc = last_json_object(text) if text is not None else None
    if rc is None:
        await _end(registry, group)
        stuck = "" if await _reaped(proc, label) else (
            f"; its process did not exit within {REAP_WAIT_S:g}s of being killed")
        err_text = _file_err(err_path, log_path, err_start)
        return OpResult(op, False, None, doc, logtail.with_summary(
            f"{op} timed out after {timeout_s:g}s{stuck}", err_text), group)
    if not keep_group:
        await _end(registry, group)  # the op is over: what it left goes too, then its stderr
    # This op's stderr: what it wrote before it exited (a start's daemon may write on).
    err_text = _file_err(err_path, log_path, err_start)
    if rc != 0:
        # Exit 70/71 with the launcher's line: the sandbox refused, the op never ran.
        error = sandboxing.launcher_failure(rc, err_text)
        error = f"{op}: {error}" if error else logtail.with_summary(f"{op} exited with {rc}",
                                                                    err_text)
    elif text is None:
        error = advice.op_stdout_too_big(op, printed)
    elif doc is None:
        error = logtail.with_summary(f"{op} printed no JSON object on stdout", err_text)
    elif op in ("start", "stop", "destroy") and doc.get("ok") is not True:
        error = f"{op} answered {json.dumps(doc)[:200]}"
    else:
        error = None
    if error is not None and keep_group:
        await _end(registry, group)  # a failed start leaves nothing running
    return OpResult(op, error is None, rc, doc, error, group)


def _read_bounded(path: Path, limit: int) -> tuple[int, str | None]:
    """(bytes in the file, its text); None for the text when it holds more than ``limit``."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            return size, None
        data = f.read(limit + 1)  # a daemon may still be writing: never more than the limit
    if len(data) > limit:
        return len(data), None
    return len(data), data.decode("utf-8", errors="replace")


def _file_err(err_path: Path, log_path: Path, start: int = 0) -> str:
    """The end of this op's stderr (bounded); an op's own file is appended to the service log
    and removed. For ``start`` (``err_path`` is the log) what came through its pipe since
    ``start`` (``ServiceLog.mark``)."""
    slog = servicelog.get(log_path)
    if err_path == log_path:
        return slog.since(start)[-logtail.TAIL_BYTES:]  # as read_tail: the end is enough
    text = logtail.read_tail(err_path)
    try:
        slog.append_file(err_path, LOG_COPY_MAX, "[oarbank-agent: the first {left_out} bytes of "
                         "this op's stderr were left out]\n")
    except OSError:
        pass
    err_path.unlink(missing_ok=True)
    return text


async def _reaped(proc: procs.ChildProcess, label: str) -> bool:
    """Whether the op's process, its group ended, exits within REAP_WAIT_S (logged if not)."""
    try:
        reaped, _ = await result_within(proc.wait(), REAP_WAIT_S)
    except ProcessLookupError:
        return True
    if not reaped:
        log.warning("%s: its process %s did not exit within %gs of being killed; going on "
                    "without it", label, proc.pid, REAP_WAIT_S)
    return reaped


async def _end(registry: procs.ProcessRegistry, group: Group) -> None:
    await procs.retire_group(registry, group, 1.0)
