"""core.flight: concurrent askers of one key share one call."""

import asyncio

import pytest

from core.flight import SingleFlight


async def test_concurrent_askers_of_one_key_share_one_call_and_its_answer():
    flights, calls = SingleFlight(), []

    async def look(key):
        calls.append(key)
        await asyncio.sleep(0.05)
        return f"answer {key}"

    answers = await asyncio.gather(
        *(flights.do(k, lambda k=k: look(k)) for k in ["a"] * 20 + ["b"] * 5)
    )
    assert answers == ["answer a"] * 20 + ["answer b"] * 5
    assert sorted(calls) == ["a", "b"]
    # Landed: the next ask is a new call.
    assert await flights.do("a", lambda: look("a")) == "answer a" and calls.count("a") == 2


async def test_a_failure_reaches_every_waiter_and_a_cancelled_one_leaves_the_others_their_answer():
    flights = SingleFlight()

    async def broken():
        await asyncio.sleep(0.05)
        raise LookupError("down")

    results = await asyncio.gather(
        *(flights.do("k", broken) for _ in range(3)), return_exceptions=True
    )
    assert [type(r) for r in results] == [LookupError] * 3

    async def slow():
        await asyncio.sleep(0.1)
        return 42

    first = asyncio.create_task(flights.do("k", slow))
    second = asyncio.create_task(flights.do("k", slow))
    await asyncio.sleep(0.02)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second == 42
