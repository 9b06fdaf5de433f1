"""An op whose process outlives its kill does not hold the agent (services/ops.py, ``_reaped``).

A fake stands in for the process: one that does not exit when killed cannot be made on this
machine (SIGKILL ends a stopped or traced process too; it was seen under Wine, where the
`start` op of the yield scenario hung the start past its start_timeout_s). The real ops and
their timeouts are covered by the service tests; this is the bound on the wait after the kill.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from oarbank_agent.services import ops


class _Unkillable:
    pid = 4242
    returncode = None

    async def wait(self) -> int:
        await asyncio.Event().wait()  # never signalled: the process never exits
        raise AssertionError("unreachable")


class _Exited:
    pid = 4243
    returncode = 0

    async def wait(self) -> int:
        return 0


def test_a_process_that_outlives_its_kill_is_given_up_on_and_said(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(ops, "REAP_WAIT_S", 0.2)
    caplog.set_level(logging.WARNING, "oarbank_agent.services.ops")
    t0 = time.monotonic()
    assert asyncio.run(ops._reaped(_Unkillable(), "m/model start")) is False
    assert time.monotonic() - t0 < 5
    assert "m/model start: its process 4242 did not exit within 0.2s" in caplog.text


def test_a_process_that_exits_is_reaped_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "oarbank_agent.services.ops")
    assert asyncio.run(ops._reaped(_Exited(), "m/model ready")) is True
    assert caplog.text == ""
