"""The endpoint wire format (contract section 3), shared by the SDK and the agent.

Rules this module enforces:

- one JSON object per line, UTF-8, at most ``MAX_LINE`` bytes per line (newline excluded);
- every message has exactly the fields of the contract's table, with the right types;
- a peer's malformed line raises ``WireError`` (code ``bad_request``) naming what is wrong;
- attempt ids (``connection``, ``ended``) are integers from agents (ours and upstream's), strings
  from older agents: parsed either way and kept as they came.

Pure functions and a line splitter: no sockets here. Standard library only.

Hot path: every connect is five messages across three processes, so each message also has
``line()`` (its encoded line, formatted without ``json``) and the ``parse_line_*`` functions
match the compact lines peers send (``{"op":"connect","pid":12}``) with one regular
expression, falling back to ``decode`` + ``parse_*`` for anything else: same result, same
errors, for every input (sdk/tests/test_wire_fast_path.py compares both on many lines).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "MAX_LINE",
    "WireError",
    "LineSplitter",
    "encode",
    "decode",
    "Connect",
    "Received",
    "Ok",
    "Refusal",
    "Hello",
    "Connection",
    "Accepted",
    "Ready",
    "Ended",
    "parse_from_job",
    "parse_from_service",
    "parse_reply_to_job",
    "parse_to_service",
    "parse_line_from_job",
    "parse_line_from_service",
    "parse_line_reply_to_job",
    "parse_line_to_service",
    "REFUSAL_CODES",
]

MAX_LINE = 4096

# Refusal codes the agent may send on a connector (contract section 3).
REFUSAL_CODES = ("service_unavailable", "rate_limited", "bad_pid", "bad_request")


class WireError(ValueError):
    """A line that breaks the wire format. ``code`` is the refusal code to answer with."""

    def __init__(self, detail: str, code: str = "bad_request") -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def encode(msg: dict[str, Any]) -> bytes:
    """One message as a line (compact JSON + ``\\n``). Raises ``WireError`` if over the cap."""
    line = json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(line) > MAX_LINE:
        raise WireError(f"message of {len(line)} bytes exceeds the {MAX_LINE}-byte line cap")
    return line + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """Parse one line (without its newline) into a JSON object, or raise ``WireError``."""
    if len(line) > MAX_LINE:
        raise WireError(f"line of {len(line)} bytes exceeds the {MAX_LINE}-byte cap")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"line is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise WireError(f"line is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise WireError(f"message must be a JSON object, got {type(value).__name__}")
    return value


class LineSplitter:
    """Accumulates bytes from a stream and yields complete lines.

    ``feed`` raises ``WireError`` as soon as an unfinished line passes ``MAX_LINE``: a peer
    cannot make us buffer without bound.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        lines: list[bytes] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                break
            lines.append(bytes(self._buf[:nl]))
            del self._buf[: nl + 1]
        if len(self._buf) > MAX_LINE:
            self._buf.clear()
            raise WireError(f"line exceeds the {MAX_LINE}-byte cap")
        return lines

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line (a peer that closed mid-message leaves some)."""
        return len(self._buf)


# --- messages ---------------------------------------------------------------------------------


_set = object.__setattr__  # each class's __init__: past its own refusal to be changed


class _Message:
    """A wire message: immutable, equal to one of the same kind with the same fields. Plain
    slotted classes, not frozen dataclasses: every runner and service imports this module at
    its start, and nine dataclasses cost it 4-5 ms there (their generated code), a class
    about 0.05."""

    __slots__: tuple[str, ...] = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((type(self), self._fields()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({inner})"


class Connect(_Message):
    """connector, job -> agent: ``{"op": "connect", "pid": n}``."""

    __slots__ = ("pid",)
    pid: int

    def __init__(self, pid: int) -> None:
        _set(self, "pid", pid)

    def to_wire(self) -> dict[str, Any]:
        return {"op": "connect", "pid": self.pid}

    def line(self) -> bytes:
        return b'{"op":"connect","pid":%d}\n' % self.pid


class Received(_Message):
    """connector, job -> agent: ``{"op": "received", "conn": n}`` once it holds its end."""

    __slots__ = ("conn",)
    conn: int

    def __init__(self, conn: int) -> None:
        _set(self, "conn", conn)

    def to_wire(self) -> dict[str, Any]:
        return {"op": "received", "conn": self.conn}

    def line(self) -> bytes:
        return b'{"op":"received","conn":%d}\n' % self.conn


class Ok(_Message):
    """connector, agent -> job: ``{"ok": true, "conn": n}``, the job's end attached
    (Windows: ``"handle": h``, the end already duplicated into the job's process)."""

    __slots__ = ("conn", "handle")
    conn: int
    handle: int | None

    def __init__(self, conn: int, handle: int | None = None) -> None:
        _set(self, "conn", conn)
        _set(self, "handle", handle)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": True, "conn": self.conn}
        if self.handle is not None:
            out["handle"] = self.handle
        return out

    def line(self) -> bytes:
        if self.handle is not None:
            return b'{"ok":true,"conn":%d,"handle":%d}\n' % (self.conn, self.handle)
        return b'{"ok":true,"conn":%d}\n' % self.conn


class Refusal(_Message):
    """connector, agent -> job: ``{"ok": false, "error": code, "detail": text}``."""

    __slots__ = ("error", "detail")
    error: str
    detail: str

    def __init__(self, error: str, detail: str) -> None:
        _set(self, "error", error)
        _set(self, "detail", detail)

    def to_wire(self) -> dict[str, Any]:
        return {"ok": False, "error": self.error, "detail": self.detail}

    def line(self) -> bytes:
        return encode(self.to_wire())


class Hello(_Message):
    """channel, service -> agent: ``{"op": "hello", "pid": n}``, exactly once, first."""

    __slots__ = ("pid",)
    pid: int

    def __init__(self, pid: int) -> None:
        _set(self, "pid", pid)

    def to_wire(self) -> dict[str, Any]:
        return {"op": "hello", "pid": self.pid}

    def line(self) -> bytes:
        return b'{"op":"hello","pid":%d}\n' % self.pid


class Connection(_Message):
    """channel, agent -> service: ``{"op": "connection", "conn": n, "attempt": id}``
    (Windows: ``"handle": h``, the service's end already duplicated into its process)."""

    __slots__ = ("conn", "attempt", "handle")
    conn: int
    attempt: int | str
    handle: int | None

    def __init__(self, conn: int, attempt: int | str, handle: int | None = None) -> None:
        _set(self, "conn", conn)
        _set(self, "attempt", attempt)
        _set(self, "handle", handle)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": "connection", "conn": self.conn, "attempt": self.attempt}
        if self.handle is not None:
            out["handle"] = self.handle
        return out

    def line(self) -> bytes:
        if isinstance(self.attempt, int) and self.handle is None:
            return b'{"op":"connection","conn":%d,"attempt":%d}\n' % (self.conn, self.attempt)
        return encode(self.to_wire())  # a string id: JSON's escaping


class Accepted(_Message):
    """channel, service -> agent: ``{"op": "accepted", "conn": n}`` once it holds its end."""

    __slots__ = ("conn",)
    conn: int

    def __init__(self, conn: int) -> None:
        _set(self, "conn", conn)

    def to_wire(self) -> dict[str, Any]:
        return {"op": "accepted", "conn": self.conn}

    def line(self) -> bytes:
        return b'{"op":"accepted","conn":%d}\n' % self.conn


class Ready(_Message):
    """channel, service -> agent: ``{"op": "ready"}``, at most once, after hello, only where
    the agent offers the ``ready`` feature (``OARBANK_ENDPOINT_FEATURES``)."""

    __slots__ = ()

    def to_wire(self) -> dict[str, Any]:
        return {"op": "ready"}

    def line(self) -> bytes:
        return b'{"op":"ready"}\n'


class Ended(_Message):
    """channel, agent -> service: ``{"op": "ended", "attempt": id}``."""

    __slots__ = ("attempt",)
    attempt: int | str

    def __init__(self, attempt: int | str) -> None:
        _set(self, "attempt", attempt)

    def to_wire(self) -> dict[str, Any]:
        return {"op": "ended", "attempt": self.attempt}

    def line(self) -> bytes:
        if isinstance(self.attempt, int):
            return b'{"op":"ended","attempt":%d}\n' % self.attempt
        return encode(self.to_wire())


def _int_field(msg: dict[str, Any], key: str, what: str) -> int:
    if key not in msg:
        raise WireError(f"{what}: missing field {key!r}")
    value = msg[key]
    # bool is an int subclass in Python; JSON true is not a number.
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"{what}: field {key!r} must be an integer, got {_json_type(value)}")
    if value < 0:
        raise WireError(f"{what}: field {key!r} must not be negative")
    return value


def _handle_field(msg: dict[str, Any], what: str) -> int | None:
    """Windows' ``"handle"``: absent (None) or a non-negative integer."""
    return _int_field(msg, "handle", what) if "handle" in msg else None


def _attempt_field(msg: dict[str, Any], what: str) -> int | str:
    """An attempt id: a non-negative integer (what agents send) or a string (older agents).

    Returned as it came, so a service can hand it back or look it up unchanged."""
    if "attempt" not in msg:
        raise WireError(f"{what}: missing field 'attempt'")
    value = msg["attempt"]
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise WireError(f"{what}: field 'attempt' must not be negative")
        return value
    raise WireError(f"{what}: field 'attempt' must be an integer or a string, got {_json_type(value)}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _op(msg: dict[str, Any]) -> str:
    op = msg.get("op")
    if op is None:
        raise WireError("message has no 'op' field")
    if not isinstance(op, str):
        raise WireError(f"field 'op' must be a string, got {_json_type(op)}")
    return op


def parse_from_job(msg: dict[str, Any]) -> Connect | Received:
    """A connector message from a job. Raises ``WireError`` for anything else."""
    op = _op(msg)
    if op == "connect":
        return Connect(_int_field(msg, "pid", "connect"))
    if op == "received":
        return Received(_int_field(msg, "conn", "received"))
    raise WireError(f"unknown op {op!r} on a connector (expected 'connect' or 'received')")


def parse_from_service(msg: dict[str, Any]) -> Hello | Accepted | Ready:
    """A channel message from a service. Raises ``WireError`` for anything else."""
    op = _op(msg)
    if op == "accepted":  # first: one per connection, the hot path
        return Accepted(_int_field(msg, "conn", "accepted"))
    if op == "hello":
        return Hello(_int_field(msg, "pid", "hello"))
    if op == "ready":
        return Ready()
    raise WireError(f"unknown op {op!r} on a channel (expected 'hello', 'ready' or 'accepted')")


def parse_reply_to_job(msg: dict[str, Any]) -> Ok | Refusal:
    """The agent's answer to a ``connect``."""
    ok = msg.get("ok")
    if ok is True:
        return Ok(_int_field(msg, "conn", "ok reply"), _handle_field(msg, "ok reply"))
    if ok is False:
        # A refusal that names no code (the field missing, null or empty) is `refused`, as
        # upstream's SDK reads it; a code of another type is a broken reply.
        error = msg.get("error") or "refused"
        if not isinstance(error, str):
            raise WireError(f"refusal: field 'error' must be a string, got {_json_type(error)}")
        detail = msg.get("detail", "")
        return Refusal(error, detail if isinstance(detail, str) else str(detail))
    raise WireError("reply has no boolean 'ok' field")


def parse_to_service(msg: dict[str, Any]) -> Connection | Ended:
    """A channel message from the agent."""
    op = _op(msg)
    if op == "connection":
        return Connection(_int_field(msg, "conn", "connection"), _attempt_field(msg, "connection"),
                          _handle_field(msg, "connection"))
    if op == "ended":
        return Ended(_attempt_field(msg, "ended"))
    raise WireError(f"unknown op {op!r} from the agent (expected 'connection' or 'ended')")


# --- the hot path: compact lines matched without json -----------------------------------------

# A JSON number that is a non-negative integer without a leading zero, at most 18 digits (so
# it fits anywhere an int goes; a longer one takes the slow path, with the same result).
_N = rb"(0|[1-9][0-9]{0,17})"
_CONNECT = re.compile(rb'\{"op":"connect","pid":' + _N + rb"\}")
_RECEIVED = re.compile(rb'\{"op":"received","conn":' + _N + rb"\}")
_OK = re.compile(rb'\{"ok":true,"conn":' + _N + rb"\}")
_ACCEPTED = re.compile(rb'\{"op":"accepted","conn":' + _N + rb"\}")
_CONNECTION = re.compile(rb'\{"op":"connection","conn":' + _N + rb',"attempt":' + _N + rb"\}")
_ENDED = re.compile(rb'\{"op":"ended","attempt":' + _N + rb"\}")


def parse_line_from_job(line: bytes) -> Connect | Received:
    """``parse_from_job(decode(line))``, compact lines matched without json."""
    m = _CONNECT.fullmatch(line)
    if m is not None:
        return Connect(int(m[1]))
    m = _RECEIVED.fullmatch(line)
    if m is not None:
        return Received(int(m[1]))
    return parse_from_job(decode(line))


def parse_line_from_service(line: bytes) -> Hello | Accepted | Ready:
    """``parse_from_service(decode(line))``, compact lines matched without json."""
    m = _ACCEPTED.fullmatch(line)
    if m is not None:
        return Accepted(int(m[1]))
    return parse_from_service(decode(line))


def parse_line_reply_to_job(line: bytes) -> Ok | Refusal:
    """``parse_reply_to_job(decode(line))``, compact lines matched without json."""
    m = _OK.fullmatch(line)
    if m is not None:
        return Ok(int(m[1]))
    return parse_reply_to_job(decode(line))


def parse_line_to_service(line: bytes) -> Connection | Ended:
    """``parse_to_service(decode(line))``, compact lines matched without json."""
    m = _CONNECTION.fullmatch(line)
    if m is not None:
        return Connection(int(m[1]), int(m[2]))
    m = _ENDED.fullmatch(line)
    if m is not None:
        return Ended(int(m[1]))
    return parse_to_service(decode(line))
