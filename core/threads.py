"""A thread of its own for each request's blocking work, taken from a pool of idle ones."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext

# Idle request threads kept for reuse; beyond this, a thread that finishes a request ends.
KEEP_IDLE_THREADS = 64

_idle: collections.deque[ThreadPoolExecutor] = collections.deque()
_lock = threading.Lock()


def _checkout() -> ThreadPoolExecutor:
    with _lock:
        if _idle:
            return _idle.pop()  # the most recently used thread: its caches are warm
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")


def _checkin(executor: ThreadPoolExecutor) -> None:
    with _lock:
        if len(_idle) < KEEP_IDLE_THREADS:
            _idle.append(executor)
            return
    executor.shutdown(wait=False)


@contextlib.asynccontextmanager
async def own_thread() -> AsyncIterator[None]:
    """Inside, `sync_to_async` (and so `core.db.run`) runs in one thread kept for this request.

    Outside any such context, asgiref runs every thread-sensitive call of the process in one
    shared thread: the blocking work of all concurrent requests would queue for it. A pooled
    thread costs less than starting one per request (asgiref's default for a context).
    """
    executor = _checkout()
    try:
        async with ThreadSensitiveContext(executor=executor):
            yield
    finally:
        _checkin(executor)
