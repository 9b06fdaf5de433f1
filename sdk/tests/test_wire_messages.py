"""The wire's message values (``oarbank_sdk._wire``): immutable, equal only to a message of
the same kind with the same fields, hashable, and shown by kind and fields."""

from __future__ import annotations

import pytest

from oarbank_sdk._wire import Accepted, Connect, Connection, Ended, Hello, Ok, Ready, Received, Refusal


def test_equal_only_to_the_same_kind_with_the_same_fields() -> None:
    assert Connect(5) == Connect(5) and Connect(5) != Connect(6)
    assert Connect(5) != Received(5) != Accepted(5)  # same field value, another message
    assert Ok(3) == Ok(3, None) != Ok(3, 7)
    assert Ready() == Ready() and Ready() != ()
    assert Connection(1, 2) != (1, 2, None)
    assert len({Hello(9), Hello(9), Ended(4), Ended("4")}) == 3


def test_immutable() -> None:
    msg = Refusal("bad_pid", "not yours")
    with pytest.raises(AttributeError):
        msg.error = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        msg.extra = 1  # type: ignore[attr-defined]
    assert msg.error == "bad_pid"


def test_shown_by_kind_and_fields() -> None:
    assert repr(Connection(1, 7, handle=None)) == "Connection(conn=1, attempt=7, handle=None)"
    assert repr(Ready()) == "Ready()"
    assert Connection(1, 7).line() == b'{"op":"connection","conn":1,"attempt":7}\n'
