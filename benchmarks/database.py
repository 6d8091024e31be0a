"""The bench database: a database of its own on the configured server, never the developer's
data."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg
from django.conf import settings
from django.db import connection, connections
from psycopg import sql

CONNECT_TIMEOUT = 10  # seconds; a server that does not answer fails the run instead of hanging it


def url_with_database(url: str, name: str) -> str:
    return urlsplit(url)._replace(path="/" + name).geturl()


def _server_connection() -> psycopg.Connection:
    """A plain connection to the server's `postgres` database. CREATE and DROP DATABASE cannot
    run in a transaction nor from inside the database they name, so not through Django's."""
    return psycopg.connect(
        url_with_database(settings.DATABASE_URL, "postgres"),
        connect_timeout=CONNECT_TIMEOUT,
        autocommit=True,
    )


def database_use(name: str, *, pool_size: int) -> bool:
    """Create database `name` on the configured server if missing and point Django at it.

    Must run before anything in this process connects: the connection pool is built
    on the first connection and would keep pointing at the developer's database.
    Returns True if the database was created.
    """
    created = False
    with _server_connection() as server:
        if (
            server.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            is None
        ):
            server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            created = True
    connections.close_all()
    db = settings.DATABASES["default"]
    db["NAME"] = name
    options = dict(db["OPTIONS"])
    if options.get("pool"):
        # One pooled connection per benchmark thread, or threads would queue for the pool
        # and the queueing would show up as latency.
        pool = dict(options["pool"]) if isinstance(options["pool"], dict) else {}
        pool["max_size"] = max(pool.get("max_size", 0), pool_size)
        options["pool"] = pool
    db["OPTIONS"] = options
    connection.settings_dict.update(NAME=name, OPTIONS=options)
    return created


def database_url(name: str) -> str:
    """DATABASE_URL for a process (daphne) that must work in database `name`."""
    return url_with_database(settings.DATABASE_URL, name)


def database_drop(name: str) -> None:
    connections.close_all()
    connection.close_pool()
    with _server_connection() as server:
        server.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
