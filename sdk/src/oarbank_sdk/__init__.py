"""oarbank-sdk: what a module author installs.

- ``oarbank_sdk.service_endpoint``: job and service sides of endpoints (standard library only).
- ``oarbank_sdk.control``, ``platform``, ``portable``, ``gpu``, ``tools``, ``secrets``,
  ``folders``, ``broker``, ``runner_protocol``: upstream's runner-side modules by their names
  (standard library only).
- ``oarbank_sdk.manifest``: load and check ``oarbank-module.toml``.
- ``oarbank-sdk check`` / ``oarbank-sdk conform``: the command line.
"""

__version__ = "0.1.0"
