"""Database work for async code that holds no connection between its round trips.

Two roads. `run(fn)` runs blocking Django code (the ORM, raw cursors) in a thread and gives its
connection back when `fn` returns. `query_one` / `query_all` run one hand-written statement:
inside `unbound()` on the event loop itself, through a psycopg async pool of the loop's own
(for the hot statements of a turn: its start and end, the KB match, the context; a thread hop
cost more than the statement), elsewhere in a thread as `run` does, so that a caller inside a
transaction (a test's, an `atomic` block) sees its own rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from psycopg_pool import AsyncConnectionPool

from core.flight import SingleFlight
from core.loops import PerLoop

T = TypeVar("T")
log = logging.getLogger(__name__)

# Set inside a request whose database work is bound to no thread (see `unbound`).
_unbound: contextvars.ContextVar[bool] = contextvars.ContextVar("db_unbound", default=False)
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
                size = (
                    settings.DATABASES["default"].get("OPTIONS", {}).get("pool", {}).get("max_size")
                    or 10
                )
                _executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="db")
    return _executor


@contextlib.contextmanager
def unbound() -> Iterator[None]:
    """For requests that are async end to end (the /v1 API, a WebSocket turn): nothing of theirs
    lives in a thread or a transaction between two calls. Inside, `run` sends its work to the
    process's database threads instead of the caller's thread-sensitive one (skipping asgiref's
    per-call context bookkeeping, which under load cost more CPU than the queries' own
    Python), and `query_one` / `query_all` run their statement on the loop."""
    token = _unbound.set(True)
    try:
        yield
    finally:
        _unbound.reset(token)


async def run(fn: Callable[..., T], /, *args, **kwargs) -> T:
    """Run blocking database work from async code, with its connection back in the pool the
    moment it returns.

    Django keeps a thread's connection until the request ends, so a streamed answer that used
    `sync_to_async` at its start held a connection for all of its tokens: with a pool of 10,
    the eleventh concurrent stream waited for one. Work given to `run` holds one only while it
    runs. Outside `unbound` it runs where `sync_to_async` would (the request's own thread),
    so a caller inside a transaction still sees its rows. Group a turn's statements into one
    call: one thread hop, one checkout.
    """
    if _unbound.get():
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(
            _threads(), context.run, _call, fn, args, kwargs
        )
    return await sync_to_async(_call, thread_sensitive=True)(fn, args, kwargs)


# --- statements on the event loop -----------------------------------------------------------------


def _close_stale(pool: AsyncConnectionPool) -> None:
    # A closed loop's pool (tests run a loop per test): its connections close with it.
    for connection in list(getattr(pool, "_pool", ())):
        connection.pgconn.finish()


_loop_pools: PerLoop[AsyncConnectionPool] = PerLoop(on_stale=_close_stale)
_pool_opening = SingleFlight()


def _conninfo() -> str:
    """The default database's connection string, as Django's backend would connect (settings
    read at first use: a test run's database has its test name by then)."""
    params = connections["default"].get_connection_params()
    keep = {
        key: value
        for key, value in params.items()
        if isinstance(value, (str, int))
        and key not in ("cursor_factory", "context", "prepare_threshold")
    }
    return psycopg.conninfo.make_conninfo("", **keep)


async def _open_pool(
    *, full: bool = False, warm: tuple[tuple[str, list | dict], ...] = ()
) -> AsyncConnectionPool:
    pool_options = settings.DATABASES["default"].get("OPTIONS", {}).get("pool") or {}

    # Twice when statements are prepared: the second run prepares it (prepare_threshold=1), so
    # no request pays for the preparing either.
    runs = 2 if settings.DATABASE_PREPARED_STATEMENTS else 1

    async def configure(connection: psycopg.AsyncConnection) -> None:
        for sql, params in warm:
            try:
                for _ in range(runs):
                    await connection.execute(sql, params)
            except (
                psycopg.Error
            ) as exc:  # the connection serves all the same, its first use a little slower
                log.warning("warming a database connection: %s: %s", type(exc).__name__, exc)

    size, timeout = pool_options.get("max_size") or 10, pool_options.get("timeout") or 10.0
    pool = AsyncConnectionPool(
        _conninfo(),
        min_size=size if full else 1,
        max_size=size,
        timeout=timeout,
        open=False,
        name="loop",
        configure=configure if warm else None,
        kwargs={
            "autocommit": True,
            "prepare_threshold": 1 if settings.DATABASE_PREPARED_STATEMENTS else None,
        },
    )
    await pool.open(wait=full, timeout=timeout)
    return _loop_pools.put(pool)


async def _pool() -> AsyncConnectionPool:
    pool = _loop_pools.peek()
    return pool if pool is not None else await _pool_opening.do("pool", _open_pool)


async def pool_prepare(warm: list[tuple[str, list | dict]]) -> int:
    """Open this loop's pool with all its connections at once, each running the statements `warm`
    (inputs that change nothing) before its first use; returns the number of connections.

    For a web process's start-up (config.warmup). A pool opened on first use starts with one
    connection and grows while requests wait, one new connection after another, each of them
    cold: a PostgreSQL backend reads the catalog for every table and index on its first
    statement about it. A burst of questions right after start-up, or the first after a quiet
    spell, would wait for both."""
    if _loop_pools.peek() is not None:
        raise RuntimeError("this event loop's pool is already open")
    pool = await _open_pool(full=True, warm=tuple(warm))
    return pool.get_stats()["pool_size"]


async def query_one(sql: str, params: dict | list | tuple = ()) -> tuple | None:
    """The first row of one statement (None when it returns none); see the module docstring."""
    rows = await _query(sql, params, one=True)
    return rows[0] if rows else None


async def query_all(sql: str, params: dict | list | tuple = ()) -> list[tuple]:
    """Every row of one statement; see the module docstring."""
    return await _query(sql, params, one=False)


async def _query(sql: str, params, *, one: bool) -> list[tuple]:
    if not _unbound.get():
        return await run(_cursor_query, sql, params, one)
    async with (await _pool()).connection() as connection:
        cursor = await connection.execute(sql, params)
        if cursor.description is None:
            return []
        if not one:
            return await cursor.fetchall()
        row = await cursor.fetchone()
        return [] if row is None else [row]


def _cursor_query(sql: str, params, one: bool) -> list[tuple]:
    with connections["default"].cursor() as cursor:
        cursor.execute(sql, params)
        if cursor.description is None:
            return []
        if one:
            row = cursor.fetchone()
            return [] if row is None else [row]
        return cursor.fetchall()
