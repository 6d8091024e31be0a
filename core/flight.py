"""One call for many waiters: concurrent askers of the same key share the call in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class SingleFlight:
    """`await flights.do(key, make)`: the first caller for `key` in an event loop starts
    `make()`; callers that come while it runs await the same result (or exception).

    For refreshes that expire for everyone at once (the rule snapshot, a cached API key):
    under load the request that finds them stale is not alone, and without this each of its
    concurrent neighbours would send the same query. A waiter that is cancelled does not
    cancel the call the others wait for."""

    def __init__(self) -> None:
        self._calls: dict[tuple[int, Hashable], asyncio.Task] = {}

    async def do(self, key: Hashable, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return await asyncio.shield(self._flight(key, make))

    def start(self, key: Hashable, make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Start `make()` for `key` unless it is in flight, and wait for nothing: a refresh
        ahead of an expiry, while the caller goes on with what it has. Its failure is the
        call's to log; a caller of `do` meanwhile awaits the same call."""
        self._flight(key, make)

    def _flight(self, key: Hashable, make: Callable[[], Coroutine[Any, Any, T]]) -> asyncio.Task:
        loop = asyncio.get_running_loop()
        slot = (id(loop), key)
        task = self._calls.get(slot)
        if task is None or task.get_loop() is not loop:
            task = loop.create_task(make())
            self._calls[slot] = task
            task.add_done_callback(lambda done: self._landed(slot, done))
        return task

    def _landed(self, slot, task: asyncio.Task) -> None:
        if self._calls.get(slot) is task:
            del self._calls[slot]
        if not task.cancelled():
            task.exception()  # retrieved: with every waiter gone, asyncio would log it as lost
