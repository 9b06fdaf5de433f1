"""Errors of the endpoint SDK (contract section 3). Standard library only."""

from __future__ import annotations

__all__ = ["EndpointError", "ChannelClosed", "LOCAL_CODES"]

# The codes this SDK raises itself (the agent's refusal codes come on top). The first six are
# upstream's SDK's, for the same situations; `timeout` is ours (only our `connect` takes one).
LOCAL_CODES = ("no_endpoint", "bad_endpoint", "no_channel", "bad_message", "refused", "closed",
               "timeout")


class EndpointError(RuntimeError):
    """An endpoint operation failed. A ``RuntimeError``, as in the upstream SDK, so modules
    written against it catch it unchanged. ``EndpointError(code, detail)``.

    ``code`` is one of the agent's refusal codes (``service_unavailable``, ``rate_limited``,
    ``bad_pid``, ``bad_request``, or whatever code an agent sends: it is passed on as sent) or
    a local one, the same as upstream's SDK for the same situation:

    - ``no_endpoint``: ``OARBANK_SERVICE_<NAME>`` is unset (the stage reserves no pool of that
      service, or the process that started this one did not pass the connector on);
    - ``bad_endpoint``: ``OARBANK_SERVICE_<NAME>`` or ``OARBANK_ENDPOINT_CHANNEL`` is set but
      names no usable stream on this system (not ``fd:<n>``, or no open socket under it);
    - ``no_channel``: ``OARBANK_ENDPOINT_CHANNEL`` is unset (not the `start` op's daemon);
    - ``bad_message``: the agent's reply broke the wire format (not JSON, over-long, an ``ok``
      without its descriptor);
    - ``refused``: the agent refused a ``connect`` without naming a code;
    - ``closed``: see ``ChannelClosed``;
    - ``timeout`` (ours): the ``connect`` exchange did not finish within the caller's timeout.

    ``detail`` is a readable explanation (the agent's own text for refusals).
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class ChannelClosed(EndpointError):
    """The connector or channel reached end of file (or broke): code ``closed``.

    Job side: the agent closed the attempt's connector; no further connects will succeed.
    Service side: the agent is stopping the service; the service should exit.
    ``ChannelClosed()`` without a detail says just that the agent closed it.
    """

    def __init__(self, detail: str = "end of file: the agent closed it") -> None:
        super().__init__("closed", detail)
