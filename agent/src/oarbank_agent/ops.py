"""Running one service op: ``<exec...> <op>`` (contract section 2).

cwd = the bundle, its own process group (session), the exact op environment and nothing else,
stdout to a file (a daemon left by ``start`` may keep it open, so we never wait for EOF on a
pipe), the document = stdout's last line that parses as a JSON object, exit 0 = success.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import procs, sandboxing
from .modules import ModuleCtx, NodeInfo

__all__ = ["OP_TIMEOUTS", "OpResult", "run_op", "last_json_line"]

# Fixed op timeouts (seconds); start and stop use the service's own bounds.
OP_TIMEOUTS = {"fingerprint": 5.0, "status": 5.0, "ready": 5.0, "list_owned": 5.0,
               "destroy": 60.0}


@dataclass
class OpResult:
    op: str
    ok: bool
    rc: int | None  # None: timed out or never started
    doc: dict[str, Any] | None
    error: str | None  # readable, when not ok
    pgid: int | None


def last_json_line(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


async def run_op(ctx: ModuleCtx, node: NodeInfo, service: str, op: str, *,
                 timeout_s: float, registry: procs.ProcessRegistry,
                 extra_env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = (),
                 after_spawn: Callable[[], None] | None = None,
                 keep_group: bool = False, args: tuple[str, ...] = ()) -> OpResult:
    """Run one op and return what it said. Never raises for the op's own failures.

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
    with open(out_path, "wb") as out, open(log_path, "ab") as err:
        err_start = err.tell()  # where this op's stderr begins (a launcher refusal lands there)
        try:
            proc = await procs.spawn(argv, env=env, cwd=ctx.manifest.bundle, stdout=out,
                                     stderr=err, pass_fds=pass_fds, registry=registry,
                                     kind="service" if keep_group else "op", label=label)
        except OSError as exc:
            if after_spawn:
                after_spawn()
            out_path.unlink(missing_ok=True)
            return OpResult(op, False, None, None, f"{op}: cannot run {argv[0]}: {exc}", None)
    if after_spawn:
        after_spawn()
    pgid = proc.pid
    rc: int | None
    try:
        rc = await asyncio.wait_for(proc.wait(), timeout_s)
    except asyncio.TimeoutError:
        rc = None
    except asyncio.CancelledError:
        await _end(registry, pgid)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()
        out_path.unlink(missing_ok=True)
        raise
    text = out_path.read_text(encoding="utf-8", errors="replace")
    out_path.unlink(missing_ok=True)
    doc = last_json_line(text)
    if rc is None:
        await _end(registry, pgid)
        await proc.wait()
        return OpResult(op, False, None, doc, f"{op} timed out after {timeout_s:g}s", pgid)
    if rc != 0:
        # Exit 70/71 with the launcher's line: the sandbox refused, the op never ran.
        error = sandboxing.launcher_failure(rc, _read_from(log_path, err_start))
        error = f"{op}: {error}" if error else f"{op} exited with {rc}"
    elif doc is None:
        error = f"{op} printed no JSON object on stdout"
    elif op in ("start", "stop", "destroy") and doc.get("ok") is not True:
        error = f"{op} answered {json.dumps(doc)[:200]}"
    else:
        error = None
    if error is not None or not keep_group:
        await _end(registry, pgid)
    return OpResult(op, error is None, rc, doc, error, pgid)


def _read_from(path: os.PathLike[str], offset: int, limit: int = 65536) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


async def _end(registry: procs.ProcessRegistry, pgid: int) -> None:
    await procs.end_group(pgid, 1.0)
    registry.remove(pgid)
