"""The `model` service of this module: the FastAPI app of app.py, served behind the agent.

The agent runs ``python -I model_service.py <op>`` (contract section 2); each op prints one
JSON document on stdout and exits 0. The ops are the reference module's
(examples/modelserver/model_service.py): ``fingerprint``, ``start`` (leave the daemon
running with the endpoint channel), ``stop``, ``status``/``ready``, ``list_owned``, ``destroy``.

The daemon (``serve``) is where this module differs, by one call: it imports the app and runs
``serve_asgi(app)`` (``oarbank_sdk.web``, the SDK's ``[web]`` extra) instead of
``uvicorn.run(app, host=..., port=...)``. That says hello on the channel, runs the app's
lifespan startup (the model loads there, once), writes the ready marker the ``ready`` op
answers from, says ready on the channel where the agent offers it, serves every connection the
agent hands over with uvicorn's own HTTP protocol, and returns when the agent closes the
channel, after the lifespan shutdown. Nothing listens.

Files in the module data dir (OARBANK_MODULE_DATA): ``model.pid`` (the daemon, written by
``start``), ``model.ready`` (the daemon's pid, once the model is loaded).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# A library bundled beside this script wins over the node's (contract section 4): `python -I`
# leaves the script's own folder off sys.path, so put it first (app.py is found there too).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from oarbank_sdk import service_endpoint as ep  # noqa: E402

SERVICE = "model"  # the service's name and its pool's (oarbank-module.toml)
PID_FILE = f"{SERVICE}.pid"
READY_FILE = f"{SERVICE}.ready"

DEFAULTS = {"slots": 8, "model_gb": 0.5, "load_s": 2.0, "token_s": 0.02}
STOP_WAIT_S = 10.0


class OpError(Exception):
    """An op cannot do its job; the message says why (printed on stderr, exit 1)."""


# --- settings and files -----------------------------------------------------------------------


def data_dir() -> Path:
    value = os.environ.get("OARBANK_MODULE_DATA")
    if not value:
        raise OpError("OARBANK_MODULE_DATA is not set: run this through the agent or conform")
    path = Path(value)
    path.mkdir(parents=True, exist_ok=True)
    return path


def settings() -> dict:
    """This node's settings for the module, defaults filled in, each value checked."""
    result = dict(DEFAULTS)
    name = os.environ.get("OARBANK_SETTINGS_FILE")
    if name and os.path.exists(name):
        try:
            with open(name, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError) as exc:
            raise OpError(f"settings file {name}: cannot read it as JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise OpError(f"settings file {name}: must hold a JSON object")
        result.update({k: v for k, v in raw.items() if k in DEFAULTS})
    slots = result["slots"]
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise OpError(f"setting 'slots' must be a positive integer, got {slots!r}")
    for key in ("model_gb", "load_s", "token_s"):
        value = result[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise OpError(f"setting {key!r} must be a non-negative number, got {value!r}")
    return result


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped counts as gone)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) is all we have


def daemon_state(d: Path) -> tuple[bool, bool]:
    """(running, ready). Ready means the running daemon itself wrote the ready marker."""
    pid = read_pid(d / PID_FILE)
    running = alive(pid)
    ready = running and read_pid(d / READY_FILE) == pid
    return running, ready


# --- the daemon -------------------------------------------------------------------------------


def serve() -> int:
    """The daemon: hello, the app's startup (the model loads), ready, serve until EOF."""
    d = data_dir()
    settings()  # a bad setting fails here, naming it, not inside the app
    from app import app  # the existing FastAPI app, unchanged

    from oarbank_sdk.web import serve_asgi

    def ready() -> None:  # after the lifespan startup: `ready` answers true from now on
        (d / READY_FILE).write_text(f"{os.getpid()}\n")

    try:
        serve_asgi(app, ep.Acceptor(), on_ready=ready, log_level="warning")
    finally:
        for name in (READY_FILE, PID_FILE):  # ours only: a newer daemon may have its own
            if read_pid(d / name) == os.getpid():
                (d / name).unlink(missing_ok=True)
    return 0


# --- ops --------------------------------------------------------------------------------------


def op_fingerprint() -> dict:
    conf = settings()
    running, _ = daemon_state(data_dir())
    return {
        "service_protocol": {"supported": [1]},
        "health": "healthy",
        "pools": {SERVICE: conf["slots"]},  # exactly the manifest's provides.pools
        "reserve": {"mem_gb": conf["model_gb"]},
        "running": running,
    }


def op_start() -> dict:
    d = data_dir()
    settings()  # refuse to start on bad settings, with the reason, rather than die in the log
    running, _ = daemon_state(d)
    if running:
        return {"ok": True}  # idempotent: the daemon is already up
    if "OARBANK_ENDPOINT_CHANNEL" not in os.environ:
        raise OpError("OARBANK_ENDPOINT_CHANNEL is not set: only the agent can start this service")
    (d / READY_FILE).unlink(missing_ok=True)
    # Stays in this op's process group (the agent ends the group on stop). Its stdout is not
    # this op's (the agent reads this op's answer there); its stderr is: the service's log,
    # where the agent finds the daemon's last words if it dies before its hello.
    proc = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), "serve"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        cwd=os.path.dirname(os.path.abspath(__file__)),
        **ep.inherit_channel(),
    )
    (d / PID_FILE).write_text(f"{proc.pid}\n")
    return {"ok": True}


def op_stop() -> dict:
    d = data_dir()
    pid = read_pid(d / PID_FILE)
    escalated = False
    if alive(pid):
        assert pid is not None
        # The daemon may exit between the check and the signal (it ends on its channel's EOF
        # too): a process already gone is what stop wants.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                escalated = True
    for name in (READY_FILE, PID_FILE):
        (d / name).unlink(missing_ok=True)
    return {"ok": True, "escalated": escalated}


def op_status() -> dict:
    running, ready = daemon_state(data_dir())
    return {"running": running, "ready": ready}


OPS = {
    "fingerprint": op_fingerprint,
    "start": op_start,
    "stop": op_stop,
    "status": op_status,
    "ready": op_status,
    "list_owned": lambda: {"objects": []},
    "destroy": lambda: {"ok": True},  # owns nothing outside its data dir
}


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        return serve()
    if not argv or argv[0] not in OPS:
        print(f"usage: model_service.py {{{','.join(OPS)}}}", file=sys.stderr)
        return 2
    try:
        result = OPS[argv[0]]()
    except OpError as exc:
        print(f"model_service {argv[0]}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
