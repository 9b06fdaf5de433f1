"""The wire's hot path (``line()`` and ``parse_line_*``) gives exactly what the JSON path
gives: the same line for every message, the same message or the same error for every line."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from oarbank_sdk import _wire as w

PAIRS = [(w.parse_line_from_job, w.parse_from_job),
         (w.parse_line_from_service, w.parse_from_service),
         (w.parse_line_reply_to_job, w.parse_reply_to_job),
         (w.parse_line_to_service, w.parse_to_service)]


def _outcome(fn, arg):
    try:
        return ("ok", fn(arg))
    except w.WireError as exc:
        return ("error", exc.code, exc.detail)


def _same_everywhere(line: bytes) -> None:
    for fast, slow in PAIRS:
        assert _outcome(fast, line) == _outcome(lambda b, slow=slow: slow(w.decode(b)), line), (fast, line)


ints = st.one_of(st.integers(min_value=-3, max_value=10**20), st.booleans(), st.none(),
                 st.floats(allow_nan=False), st.text(max_size=4))


@given(op=st.sampled_from(["connect", "received", "hello", "accepted", "ready", "connection",
                           "ended", "nope"]),
       a=ints, b=ints, key=st.sampled_from(["pid", "conn", "attempt", "x"]))
def test_every_parse_agrees_with_the_json_path(op, a, b, key) -> None:
    for msg in ({"op": op, key: a}, {"op": op, "conn": a, "attempt": b}, {"ok": True, "conn": a},
                {"ok": False, "error": "rate_limited", "detail": str(b)}, {"op": op}):
        for sep in ((",", ":"), (", ", ": ")):
            _same_everywhere(json.dumps(msg, separators=sep).encode())


@given(st.binary(max_size=60))
def test_arbitrary_bytes_agree_with_the_json_path(data) -> None:
    _same_everywhere(data)


def test_compact_lines_take_the_fast_path_and_odd_ones_the_slow() -> None:
    assert w.parse_line_from_job(b'{"op":"connect","pid":17}') == w.Connect(17)
    assert w.parse_line_to_service(b'{"op":"connection","conn":3,"attempt":9}') == \
        w.Connection(3, 9)
    # A leading zero is not JSON: both paths refuse it alike.
    _same_everywhere(b'{"op":"connect","pid":017}')
    _same_everywhere(b'{"op":"received","conn":12345678901234567890123}')  # slow path, same


@given(n=st.integers(min_value=0, max_value=2**62), s=st.text(max_size=8))
def test_every_line_is_the_json_encoding(n, s) -> None:
    for m in (w.Connect(n), w.Received(n), w.Ok(n), w.Hello(n), w.Accepted(n), w.Ready(),
              w.Connection(n, n), w.Connection(n, s), w.Ended(n), w.Ended(s),
              w.Refusal("bad_request", s)):
        assert m.line() == w.encode(m.to_wire())
