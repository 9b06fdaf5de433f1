"""The HTTP front: the portal's requests (``app.Portal``), their ASGI app and server, and the
report's HTTP path (token, backpressure, answer); nothing below imports it."""
