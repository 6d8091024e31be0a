"""core.db's statements on the event loop: its own pool, prepared statements, a whole pool at
start-up."""

import pytest

from core import db

MARKER = "SELECT %s::int + 1 AS core_db_test"


@pytest.fixture(autouse=True)
async def _pool_closed_while_its_loop_runs():
    """These tests grow this loop's pool to its full size. Closed with the loop instead, its
    workers are cancelled, and one cancelled while it connects can swallow the cancellation
    (Python 3.11's `asyncio.wait_for` may turn it into a timeout, which the pool logs as a failed
    connection and goes on): the loop's close then waits for that worker until the test times out,
    as it did once in a fresh clone's run beside another (300 s)."""
    yield
    pool = db._loop_pools.peek()
    if pool is not None:
        await pool.close(timeout=10)


async def _prepared_on_each(marker: str) -> list[int]:
    """How many statements with `marker` each connection of this loop's pool has prepared."""
    pool = await db._pool()
    connections = [await pool.getconn() for _ in range(pool.get_stats()["pool_size"])]
    try:
        counts = []
        for connection in connections:
            cursor = await connection.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                [f"%{marker}%"],
            )
            counts.append((await cursor.fetchone())[0])
        return counts
    finally:
        for connection in connections:
            await pool.putconn(connection)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("enabled", [True, False])
async def test_a_hot_statement_is_prepared_once_it_runs_again_unless_turned_off(settings, enabled):
    settings.DATABASE_PREPARED_STATEMENTS = enabled
    with db.unbound():
        assert [await db.query_one(MARKER, [n]) for n in range(6)] == [(n + 1,) for n in range(6)]
        counts = await _prepared_on_each("core_db_test")
    # Connections take turns; each that ran it twice has it prepared, once: PostgreSQL plans it
    # once per connection instead of once per run.
    assert max(counts) == (1 if enabled else 0)


@pytest.mark.django_db(transaction=True)
async def test_a_prepared_pool_opens_every_connection_warmed_by_the_statements(settings):
    size = settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"]
    opened = await db.pool_prepare([(MARKER, [0])])
    assert opened == size
    with db.unbound():
        # Every connection ran the statements before its first use, and prepared them: whichever
        # connection serves a request, it neither reads the catalog nor plans.
        assert await _prepared_on_each("core_db_test") == [1] * size
    with pytest.raises(RuntimeError, match="already open"):
        await db.pool_prepare([])
