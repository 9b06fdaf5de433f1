"""The secrets delivered to this job (``OARBANK_SECRETS_FILE``), by upstream's names
(``from oarbank_sdk import secrets``). Standard library only.

    key = secrets.get("provider_key")   # SecretMissing when this job was given none by that name

The file is a JSON object ``{name: value}``. This agent delivers no secrets yet, so a runner
here sees none (``names() == []``); never log a value or write it into a result.
"""

from __future__ import annotations

from ._envfile import json_object

__all__ = ["ENV", "SecretMissing", "get", "names"]

ENV = "OARBANK_SECRETS_FILE"


class SecretMissing(LookupError):
    """No secret by that name was delivered to this job."""


def _delivered() -> dict[str, str]:
    return {str(k): str(v) for k, v in json_object(ENV).items()}


def names() -> list[str]:
    """The names delivered to this job, sorted."""
    return sorted(_delivered())


def get(name: str) -> str:
    """The value of secret ``name``; ``SecretMissing`` when it was not delivered."""
    value = _delivered().get(name)
    if value is None:
        raise SecretMissing(f"secret {name!r} was not delivered to this job (its stage must "
                            "list it, and this agent delivers no secrets yet)")
    return value
