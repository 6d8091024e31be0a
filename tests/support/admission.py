"""Requests standing at an endpoint's admission (inference_ops.admission) in an event loop of
their own, as another web process's would: what the dashboard and the route tester read."""

import asyncio
import threading
import time

import redis
from django.conf import settings

from inference_ops import admission, admission_gate


class Standing:
    """An event loop in a thread; `enter` starts a request at an endpoint's admission there."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.places: list = []
        self.requests: list = []

    def enter(self, endpoint: str, capacity: int, *, tenant: str, priority: str):
        """The request's future: its place once admitted (EngineError past its deadline)."""

        async def one():
            admission.ticket.set(admission.Ticket(tenant=tenant, priority=priority, tokens=100))
            place = await admission_gate.admit(endpoint, capacity, 20.0)
            self.places.append(place)
            return place

        future = asyncio.run_coroutine_threadsafe(one(), self.loop)
        self.requests.append(future)
        return future

    def leave(self, place) -> None:
        self.places.remove(place)

        async def give_back():
            place.leave()

        asyncio.run_coroutine_threadsafe(give_back(), self.loop).result(10)

    def close(self) -> None:
        """Every request cancelled, every place given back, the loop's background work done."""

        async def end():
            me = asyncio.current_task()
            for future in self.requests:
                future.cancel()
            for place in self.places:
                place.leave()
            async with asyncio.timeout(20):  # the gates' background work, as it winds down
                while others := [t for t in asyncio.all_tasks() if t is not me]:
                    await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(end(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def endpoint_name(prefix: str) -> str:
    return f"{prefix}-{time.monotonic_ns()}"


def forget(endpoint: str, url: str) -> None:
    """The endpoint's admission keys gone from the Redis at `url` (read before a test changes
    REDIS_URL)."""
    client = redis.Redis.from_url(url)
    keys = client.keys(f"{settings.REDIS_KEY_PREFIX}:admission:{endpoint}:*")
    if keys:
        client.delete(*keys)
