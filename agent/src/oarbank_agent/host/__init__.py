"""The host seam: what the agent asks of the operating system, behind public functions.

- ``proctable``: the process table: members of a process group, start times, boot id,
  ``/proc/<pid>/status`` and ``cmdline``.
- ``cgroups``: cgroup v2, the mechanism (find the agent's cgroup, move a child in, end and
  remove one); ``containment`` (outside this package) is the policy.
- ``pidfd``: pidfds: wait for a process group to be gone, reap children without a thread each.
- ``unixpath``: unix socket addresses for paths of any length.
- ``gpuapis``: which GPU APIs this host provides (probes in child processes under a watchdog).
- ``memory``: available and total memory, resident memory per process group.

Nothing here decides anything about jobs or services; per-OS code lives here (and in the
SDK's sandbox package) only. This file imports nothing, so ``python -m
oarbank_agent.host.gpuapis`` loads only the probe.
"""
