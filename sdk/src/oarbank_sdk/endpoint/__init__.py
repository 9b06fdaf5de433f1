"""The parts behind ``oarbank_sdk.service_endpoint``: import that module, not these.

- ``job``: the job side (``request``, ``connect``, ``HTTPConnection``, the connectors).
- ``service``: the service side (``Acceptor``, ``serve_http``, ``inherit_channel``).
- ``stream``: the message stream both sides speak over their socket to the agent.
- ``errors``: ``EndpointError`` and ``ChannelClosed``.

Standard library only, like ``service_endpoint`` itself: this file imports nothing, so that
importing ``oarbank_sdk.service_endpoint`` loads only what it uses.
"""
