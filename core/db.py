"""Database work for async code that holds no connection between its round trips."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

T = TypeVar("T")


def release_connections() -> None:
    """Hand this thread's database connections back (to the pool, when there is one).

    A connection inside a transaction stays: its owner is not done with it (a test's
    transaction, an `atomic` block that called into async code)."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()


def _call(fn: Callable[..., T], args, kwargs) -> T:
    try:
        return fn(*args, **kwargs)
    finally:
        release_connections()


async def run(fn: Callable[..., T], /, *args, **kwargs) -> T:
    """Run blocking database work from async code, with its connection back in the pool the
    moment it returns.

    Django keeps a thread's connection until the request ends, so a streamed answer that used
    `sync_to_async` at its start held a connection for all of its tokens: with a pool of 10,
    the eleventh concurrent stream waited for one. Work given to `run` holds one only while it
    runs. It runs where `sync_to_async` would (the request's own thread), so a caller inside a
    transaction still sees its rows. Group a turn's statements into one call: one thread hop,
    one checkout.
    """
    return await sync_to_async(_call, thread_sensitive=True)(fn, args, kwargs)
