"""The `model` service of the reference module: a stand-in model, loaded once, shared by jobs.

The agent runs ``python -I model_service.py <op>`` (contract section 2). Each op prints one
JSON document on stdout and exits 0 on success:

    fingerprint   pools and memory this node may offer, whether the daemon runs
    start         leave the daemon (``serve``) running with the endpoint channel; return quickly
    stop          ask the daemon to exit and wait for it
    status/ready  {"running", "ready"}: ready only once the model is loaded
    list_owned    objects this service created outside its data dir (none)
    destroy       remove such an object (nothing to do)

The daemon never listens: it says hello on the channel the agent gave ``start``, loads the
model, writes the ready marker (the ``ready`` op answers from it: the contract's way, which
every agent polls), says ``ready`` on the channel too where the SDK and the agent offer it,
then serves HTTP on every connection the agent hands it (``serve_http``). It exits when the
agent closes the channel.

Portable: this file and the runner use only what upstream's ``service_endpoint`` has too, so
they run unchanged on upstream's SDK and on ours. What only ours offers (``Acceptor.ready``)
is looked up first and used only where present.

Files in the module data dir (OARBANK_MODULE_DATA):
    model.pid     the daemon's pid (written by ``start``)
    model.ready   the daemon's pid, written once the model is loaded
    model.loads   one line (a pid) per model load: the demo counts them

The daemon's stderr is the one ``start`` got: the agent's log of this service (conform's
``ops/<service>/start.err``), so a daemon that dies early is quoted in the agent's error.

Standard library plus ``oarbank_sdk.service_endpoint`` only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

# A library bundled beside this script wins over the node's, the SDK included (contract
# section 4): `python -I` leaves the script's own folder off sys.path, so put it first.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from oarbank_sdk import service_endpoint as ep  # noqa: E402

SERVICE = "model"  # the service's name and its pool's (oarbank-module.toml); `oarbank-sdk new` sets it
PATH = "/v1/generate"  # the one HTTP path it answers; the runner posts there
PID_FILE = f"{SERVICE}.pid"
READY_FILE = f"{SERVICE}.ready"
LOADS_FILE = f"{SERVICE}.loads"

DEFAULTS = {"slots": 4, "model_gb": 0.5, "load_s": 1.0}
MAX_BODY = 1 << 20  # a prompt larger than 1 MiB is a bad request, not a reason to run out of memory
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
    for key in ("model_gb", "load_s"):
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
    if os.name == "nt":
        return _alive_on_windows(pid)  # os.kill(pid, 0) there would end the process
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


def _alive_on_windows(pid: int) -> bool:
    """A handle that can wait on ``pid``, and the wait not yet over: it runs."""
    import ctypes

    kernel32 = ctypes.WinDLL("kernel32")  # type: ignore[attr-defined]  (Windows only)
    synchronize, wait_timeout = 0x00100000, 0x102
    handle = kernel32.OpenProcess(synchronize, False, pid)
    if not handle:
        return False  # gone (or never ours to see: this service's own pids always are)
    try:
        return bool(kernel32.WaitForSingleObject(handle, 0) == wait_timeout)
    finally:
        kernel32.CloseHandle(handle)


def daemon_state(d: Path) -> tuple[bool, bool]:
    """(running, ready). Ready means the running daemon itself wrote the ready marker."""
    pid = read_pid(d / PID_FILE)
    running = alive(pid)
    ready = running and read_pid(d / READY_FILE) == pid
    return running, ready


def count_loads(d: Path) -> int:
    try:
        with open(d / LOADS_FILE, encoding="ascii") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


# --- the stand-in model -----------------------------------------------------------------------


def complete(prompt: str) -> str:
    """The 'model': deterministic, so goldens can pin it. The prompt reversed, plus a tag."""
    tag = hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:8]
    return f"{prompt[::-1]} [{tag}]"


def load_model(d: Path, load_s: float) -> None:
    time.sleep(load_s)  # a real module loads weights here
    with open(d / LOADS_FILE, "a", encoding="ascii") as f:
        f.write(f"{os.getpid()}\n")


class Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive on each connection the agent hands over."""

    protocol_version = "HTTP/1.1"
    server_version = "modelserver/0.1"
    data: Path  # set by serve()

    def _send_json(self, status: int, obj: dict, headers: dict | None = None) -> None:
        body = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, **headers: str) -> None:
        self._send_json(status, {"error": message}, headers)

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering 400 (the connection then closes:
        an unread body would be taken for the next request)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            self._error(400, "chunked bodies are not supported: send Content-Length")
            return None
        length_text = self.headers.get("Content-Length", "0")
        if not length_text.isdigit():
            self.close_connection = True
            self._error(400, f"bad Content-Length {length_text!r}")
            return None
        length = int(length_text)
        if length > MAX_BODY:
            self.close_connection = True
            self._error(400, f"body of {length} bytes exceeds {MAX_BODY}")
            return None
        return self.rfile.read(length)

    def _route(self) -> None:
        if self.path != PATH:
            self._read_body()  # keep the connection usable for the next request
            self._error(404, f"no such path {self.path!r}; try POST {PATH}")
            return
        if self.command != "POST":
            self._read_body()
            self._error(405, f"{self.command} not allowed; use POST", Allow="POST")
            return
        body = self._read_body()
        if body is None:
            return
        try:
            request = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            self._error(400, f"body is not JSON ({exc})")
            return
        if not isinstance(request, dict):
            self._error(400, "body must be a JSON object like {\"prompt\": \"...\"}")
            return
        prompt = request.get("prompt")
        if not isinstance(prompt, str):
            what = "missing" if "prompt" not in request else f"a {type(prompt).__name__}"
            self._error(400, f"'prompt' must be a string, got {what}")
            return
        self._send_json(
            200, {"text": complete(prompt), "loads": count_loads(self.data), "pid": os.getpid()}
        )

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _route

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib name)
        # stderr is the service's log on the agent: one short line per request.
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {format % args}\n")


def serve() -> int:
    """The daemon: hello, load, serve until the agent closes the channel."""
    d = data_dir()
    conf = settings()
    acc = ep.Acceptor()  # says hello: the agent may hand connections from now on

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(0)  # `stop` sent SIGTERM: unwind through the finally below

    signal.signal(signal.SIGTERM, on_term)
    try:
        load_model(d, float(conf["load_s"]))
        (d / READY_FILE).write_text(f"{os.getpid()}\n")  # `ready` answers true from now on
        say_ready = getattr(acc, "ready", None)  # our SDK's; upstream's has none: polled then
        if callable(say_ready):
            say_ready()  # where the agent offers it: jobs start now, not at its next `ready` poll
        Handler.data = d
        ep.serve_http(Handler, acc)  # returns when the agent closes the channel (EOF)
    finally:
        # Remove only our own markers: a newer daemon may already have written its own.
        for name in (READY_FILE, PID_FILE):
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
                os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))  # (Windows: one kill)
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
