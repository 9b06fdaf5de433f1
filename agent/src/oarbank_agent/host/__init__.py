"""The host's resources the node offers: its GPU APIs and its memory, as the portal and
admission see them.

- ``gpuapis``: which GPU APIs this host provides (probes in child processes under a watchdog).
- ``memory``: available and total memory (what each group holds is the platform backend's).
- ``gpumem``: each GPU's memory used and total, and what each process holds, from NVML
  (``nvidia-ml-py``, optional); unknown with the reason where it cannot be read.

Nothing here decides anything about jobs or services, and nothing here starts, ends or limits
a process: that is the platform backend's (``oarbank_agent.platform``). The GPU probes do ask
which system this is: the APIs to look for differ per system (Metal, DirectML, CUDA...).
This file imports nothing, so ``python -m oarbank_agent.host.gpuapis`` loads only the probe.
"""
