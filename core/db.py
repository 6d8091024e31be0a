"""Database work for async code that holds no connection between its round trips."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

T = TypeVar("T")

# Set inside a request whose database work may run in any thread (see `any_thread`).
_any_thread: contextvars.ContextVar[bool] = contextvars.ContextVar("db_any_thread", default=False)
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


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


def _threads() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                # As many threads as the pool has connections: more would only wait for one.
                size = settings.DATABASES["default"].get("OPTIONS", {}).get("pool", {}).get("max_size") or 10
                _executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="db")
    return _executor


@contextlib.contextmanager
def any_thread() -> Iterator[None]:
    """Inside, `run` sends its work to the process's database threads instead of the caller's
    thread-sensitive one. For requests that are async end to end (the /v1 API, a WebSocket
    turn): nothing of theirs lives in a thread between two calls, and each call gives its
    connection back, so any thread will do. It skips asgiref's per-call context bookkeeping,
    which under load cost the gateway more CPU than the queries' own Python."""
    token = _any_thread.set(True)
    try:
        yield
    finally:
        _any_thread.reset(token)


async def run(fn: Callable[..., T], /, *args, **kwargs) -> T:
    """Run blocking database work from async code, with its connection back in the pool the
    moment it returns.

    Django keeps a thread's connection until the request ends, so a streamed answer that used
    `sync_to_async` at its start held a connection for all of its tokens: with a pool of 10,
    the eleventh concurrent stream waited for one. Work given to `run` holds one only while it
    runs. Outside `any_thread` it runs where `sync_to_async` would (the request's own thread),
    so a caller inside a transaction still sees its rows. Group a turn's statements into one
    call: one thread hop, one checkout.
    """
    if _any_thread.get():
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(_threads(), context.run, _call, fn, args, kwargs)
    return await sync_to_async(_call, thread_sensitive=True)(fn, args, kwargs)
