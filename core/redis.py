"""The process's Redis clients: one blocking client for threads, one asyncio client per event loop.

Both use blocking pools: under a burst a caller waits for a free connection (up to
REDIS_TIMEOUT) instead of failing with "too many connections". Every call has REDIS_TIMEOUT
as its socket timeout.
"""

from __future__ import annotations

import threading

import redis
import redis.asyncio as aioredis
from django.conf import settings

from core.loops import PerLoop

MAX_CONNECTIONS = 64

_client: redis.Redis | None = None
_client_lock = threading.Lock()
_aclients: PerLoop[aioredis.Redis] = PerLoop()


def _pool_options() -> dict:
    return {
        "max_connections": MAX_CONNECTIONS,
        "timeout": settings.REDIS_TIMEOUT,
        "socket_timeout": settings.REDIS_TIMEOUT,
        "socket_connect_timeout": settings.REDIS_TIMEOUT,
    }


def client() -> redis.Redis:
    """For blocking code (any thread)."""
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                pool = redis.BlockingConnectionPool.from_url(settings.REDIS_URL, **_pool_options())
                _client = redis.Redis(connection_pool=pool)
    return _client


def aclient() -> aioredis.Redis:
    """For async code: the running loop's client (connections belong to the loop that opened
    them)."""
    return _aclients.get(
        lambda: aioredis.Redis(
            connection_pool=aioredis.BlockingConnectionPool.from_url(
                settings.REDIS_URL, **_pool_options()
            )
        )
    )
