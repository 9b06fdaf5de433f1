"""The agent's child watcher: real children, reaped on the loop, no thread per child."""

from __future__ import annotations

import asyncio
import sys
import threading

from oarbank_agent.platform.linux.pidfd import use_child_watcher


def test_children_are_reaped_with_their_exit_codes_and_no_thread_each():
    async def scenario() -> tuple[str, list[int | None], int, int]:
        watcher = use_child_watcher(asyncio.get_running_loop())
        base = threading.active_count()
        # Each child waits for a line on its stdin: all 16 run until the test has counted.
        procs = [await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", f"read _; exit {i % 4}", stdin=asyncio.subprocess.PIPE)
            for i in range(16)]
        during = threading.active_count()
        assert all(p.returncode is None for p in procs)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.close()
        codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 30)
        return watcher, codes, base, during

    policy = asyncio.get_event_loop_policy()
    try:
        watcher, codes, base, during = asyncio.run(scenario())
    finally:
        if sys.version_info < (3, 12):
            policy.set_child_watcher(None)  # later tests get the default again
    assert codes == [i % 4 for i in range(16)]
    if sys.platform == "linux":
        if sys.version_info < (3, 12):
            assert watcher == "pidfd"
        assert during == base, f"{during - base} threads for 16 live children"
