"""eventwait: a watcher loop woken and cancelled in the same loop turn still ends.

Before it, the owned-object reaper and the refresher used ``asyncio.wait_for(ev.wait(), t)``:
on Python 3.11 an attempt ending during shutdown (the wake) plus ``aclose`` (the cancel)
lost the cancel every time, and the agent hung after its drain.
"""

from __future__ import annotations

import asyncio

from oarbank_agent.eventwait import wait_event


async def _watcher(wake: asyncio.Event, rounds: list[bool]) -> None:
    while True:
        rounds.append(await wait_event(wake, 30.0))
        wake.clear()


def test_a_cancel_in_the_same_turn_as_the_wake_ends_the_loop() -> None:
    async def main() -> int:
        hung = 0
        for _ in range(20):
            wake, rounds = asyncio.Event(), []
            task = asyncio.create_task(_watcher(wake, rounds))
            await asyncio.sleep(0)  # the watcher is waiting
            wake.set()
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=2.0)
            if not done:
                hung += 1
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        return hung

    assert asyncio.run(main()) == 0


def test_it_says_whether_the_event_came_or_the_time_ran_out() -> None:
    async def main() -> tuple[bool, bool, int]:
        ev = asyncio.Event()
        late = await wait_event(ev, 0.01)
        asyncio.get_running_loop().call_later(0.01, ev.set)
        came = await wait_event(ev, 30.0)
        # no waiter task is left behind either way
        left = len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])
        return late, came, left

    assert asyncio.run(main()) == (False, True, 0)
