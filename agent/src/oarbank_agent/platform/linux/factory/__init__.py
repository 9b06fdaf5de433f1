"""The process factory (Linux): one warm helper that forks every child of the agent.

``client`` (the agent's side, asyncio) asks ``server`` (the factory process) for a child;
``child`` is what the forked child does until it execs or runs its script in place; ``plan``
holds the pure decisions (the sandbox launcher's argv, running ``python -I`` in place);
``wire`` the messages; ``selfconfine`` the factory's own walls. Whether there is a factory,
and which client is installed, is ``oarbank_agent.factory``'s.

Kept free of imports: the factory process imports this package (and the ones above it) too.
"""
