"""Which Host headers the portal answers (``--allowed-host``).

A browser on an operator's desk can be made to send requests to ``127.0.0.1:8470`` by any web
page, through a DNS name that resolves there (DNS rebinding): the request then carries that
name as its Host. Answering only the names the portal is served under closes that door.

An entry ``name`` allows that name on any port, ``name:port`` only that port, ``*`` any Host
(for a portal behind a reverse proxy that checks Host itself).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable

__all__ = ["HostCheck", "default_hosts"]


def _split(value: str) -> tuple[str, str | None]:
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8470
        host, _, rest = value[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else None
    if value.count(":") == 1:
        host, _, port = value.partition(":")
        return host, port
    return value, None


class HostCheck:
    def __init__(self, allowed: Iterable[str]) -> None:
        self.allowed = [a.strip() for a in allowed if a.strip()]
        self._any = "*" in self.allowed
        self._entries = [_split(a) for a in self.allowed if a != "*"]
        self._seen: set[str] = set()  # Host values allowed already (few: a fleet sends one)

    def allows(self, host: str | None) -> bool:
        if self._any or host in self._seen:
            return True
        if not host:
            return False
        name, port = _split(host)
        ok = any(name == n and (p is None or p == port) for n, p in self._entries)
        if ok and len(self._seen) < 64:  # only allowed values: a stranger cannot grow it
            self._seen.add(host)
        return ok

    def refusal(self, host: str | None) -> str:
        if not host:
            return "request has no Host header"
        return (f"Host {host!r} is not served here (allowed: {', '.join(self.allowed)}; "
                "oarbank-portal serve --allowed-host adds one)")


def default_hosts(listen_host: str | None, port: int | None) -> list[str]:
    """The names a portal on ``listen_host:port`` (None: a unix socket) answers by default."""
    if listen_host is None:
        return ["localhost"]  # what clients on a unix socket send (the agent does)
    names = {listen_host.strip("[]"), "localhost", "127.0.0.1", "::1"}
    if listen_host in ("0.0.0.0", "::", ""):  # every interface: this machine's own names
        names |= {socket.gethostname(), socket.getfqdn()}
        names -= {"0.0.0.0", "::", ""}
    return sorted(f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in names)
