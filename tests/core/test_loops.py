"""core.loops.PerLoop: a value never crosses to another event loop, and a closed loop's is
closed."""

import asyncio

from core.loops import PerLoop


def test_each_loop_gets_its_own_value_and_a_closed_loops_value_is_handed_to_on_stale():
    stale = []
    values = PerLoop(on_stale=stale.append)

    async def get(key=None):
        return values.get(object, key)

    first_loop = asyncio.new_event_loop()
    first = first_loop.run_until_complete(get())
    assert first_loop.run_until_complete(get()) is first  # made once per loop and key
    assert first_loop.run_until_complete(get("other")) is not first
    first_loop.close()

    second_loop = asyncio.new_event_loop()
    try:
        second = second_loop.run_until_complete(get())
        assert second is not first
        assert first in stale and len(stale) == 2  # both of the closed loop's values
        assert second_loop.run_until_complete(get()) is second
    finally:
        second_loop.close()
