"""The host seam: what the agent asks of the operating system, behind public functions.

- ``gpuapis``: which GPU APIs this host provides (probes in child processes under a watchdog).
- ``memory``: available and total memory (what each group holds is the platform backend's).

Nothing here decides anything about jobs or services; per-OS code lives in ``oarbank_agent.platform``
(and in the SDK's sandbox package). This file imports nothing, so ``python -m
oarbank_agent.host.gpuapis`` loads only the probe.
"""
