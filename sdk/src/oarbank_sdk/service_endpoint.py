"""Endpoints: jobs reach a warm service through the agent; nothing listens (contract section 3).

Job side::

    from oarbank_sdk import service_endpoint as ep
    r = ep.request("model", "POST", "/v1/generate", {"prompt": "..."})
    text = r.json()["text"]

Service side::

    acc = ep.Acceptor()            # says hello
    load_the_model()
    acc.ready()                    # jobs may start now (where the agent offers it; else polled)
    ep.serve_http(Handler, acc)    # a pooled thread per connection; returns when the agent stops us

A superset of the upstream SDK's ``service_endpoint``: its names, positional orders, defaults
and error codes, and ours on top (the table is in sdk/README.md; upstream's names are listed
as data in sdk/tests/upstream_service_endpoint.json). A module written against upstream's runs
on both; one that uses ours (``Acceptor.ready``, say) runs on upstream's if it checks first
(``getattr(acc, "ready", None)``), as examples/modelserver does.

Standard library only (this module and everything it imports).
"""

from __future__ import annotations

import sys

from oarbank_sdk._wire import MAX_LINE
from oarbank_sdk.endpoint.errors import ChannelClosed, EndpointError
from oarbank_sdk.endpoint.job import (
    PREFIX,
    REQUEST_TIMEOUT_S,
    HTTPConnection,
    Response,
    available,
    connect,
    env_name,
    inherit_connector,
    request,
)
from oarbank_sdk.endpoint.service import (
    CHANNEL_ENV,
    CONNECTIONS_PER_ATTEMPT,
    FEATURES_ENV,
    MAX_PER_ATTEMPT,
    Acceptor,
    EndpointSocket,
    inherit_channel,
    serve_http,
)

WINDOWS = sys.platform == "win32"  # handles travel as `handle:<n>` there, `fd:<n>` elsewhere

__all__ = [
    "EndpointError",
    "ChannelClosed",
    "available",
    "connect",
    "request",
    "Response",
    "HTTPConnection",
    "inherit_connector",
    "env_name",
    "Acceptor",
    "EndpointSocket",
    "inherit_channel",
    "serve_http",
    "CHANNEL_ENV",
    "FEATURES_ENV",
    "CONNECTIONS_PER_ATTEMPT",
    "REQUEST_TIMEOUT_S",
    "PREFIX",
    "MAX_LINE",
    "MAX_PER_ATTEMPT",
    "WINDOWS",
]
