"""Errors of the endpoint SDK (contract section 3). Standard library only."""

from __future__ import annotations

__all__ = ["EndpointError", "ChannelClosed"]


class EndpointError(RuntimeError):
    """An endpoint operation failed. A ``RuntimeError``, as in the upstream SDK, so modules
    written against it catch it unchanged.

    ``code`` is one of the agent's refusal codes (``service_unavailable``, ``rate_limited``,
    ``bad_pid``, ``bad_request``) or a local one:

    - ``no_connector``: ``OARBANK_SERVICE_<NAME>`` is unset or not an open stream (the stage
      reserves no pool of that service, or the runner did not pass the connector on);
    - ``no_channel``: ``OARBANK_ENDPOINT_CHANNEL`` is unset or not an open stream;
    - ``protocol_error``: the agent's reply broke the wire format;
    - ``timeout``: the ``connect`` exchange did not finish within the caller's timeout;
    - ``closed``: see ``ChannelClosed`` (the code upstream's SDK uses).

    ``detail`` is a readable explanation (the agent's own text for refusals).
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class ChannelClosed(EndpointError):
    """The connector or channel reached end of file (or broke).

    Job side: the agent closed the attempt's connector; no further connects will succeed.
    Service side: the agent is stopping the service; the service should exit.
    """

    def __init__(self, detail: str) -> None:
        super().__init__("closed", detail)
