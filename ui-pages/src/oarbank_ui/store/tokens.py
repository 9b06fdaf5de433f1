"""Node credentials (contract section 6.2): the portal issues a token per node and keeps only
its hash.

A token is 32 random bytes (urlsafe base64) behind a ``oarbank_`` prefix, so a leaked one is
recognisable in a log or a paste. SHA-256 without salt or stretching is enough: the token has
256 bits of entropy (nothing to guess), and an unsalted hash is what lets the portal find the
node by the hash in one indexed lookup.
"""

from __future__ import annotations

import hashlib
import secrets

__all__ = ["PREFIX", "bearer_token", "new_token", "token_hash"]

PREFIX = "oarbank_"


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
