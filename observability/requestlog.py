"""The request log: one compact row per answered request, written in batches after the answer.

`chat.turns` builds a `RequestRecord` when a turn ends (complete, partial, failed or cancelled)
and hands it to `request_note`, which only appends to memory (`core.batches.BatchWriter`); a
thread writes the rows in one INSERT per batch. No text of the question or answer and no JSON:
the row is numbers and short names, so a month of traffic stays small.

The table is partitioned by day (UTC) on `at`. A batch creates the partitions it needs; the
retention task (`requestlog_prune`) drops whole days older than REQUEST_LOG_DAYS, which frees
their space at once and leaves no dead rows behind, as a DELETE would.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.utils import IntegrityError, ProgrammingError
from psycopg import errors as pg_errors

from core.batches import BatchWriter, BufferStats

logger = logging.getLogger(__name__)

TABLE = "chat_requestlog"  # RequestLog's table, named when the log was the chat app's


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What one request did, as its user saw it."""

    at: datetime  # when the request arrived
    # web (the browser's socket) | api (the DRF chat API) | v1 (the OpenAI-compatible API)
    interface: str
    user_id: int | None
    api_key_id: int | None
    session_id: int | None  # the chat session the turn was stored in; None for /v1 without one
    road: str  # kb | local | external | "" (failed before a road was chosen)
    rule: str
    target: str
    status: str  # complete | partial | failed | cancelled
    error_code: str
    ttft_ms: float | None  # arrival to the first token the user got
    latency_ms: float  # arrival to the end
    overhead_ms: float | None  # the gateway's own share of latency_ms (the rest is the engine's)
    prompt_tokens: int | None
    completion_tokens: int | None
    cost: float | None  # in SPEND_CURRENCY (spend.prices); 0 for a direct answer
    # What the KB check did: exact | vector | none | follow_up | "" (no check: a named model).
    kb_method: str
    kb_hit: bool
    kb_entry_id: int | None  # the entry that answered, or the best candidate that did not
    kb_score: float | None
    fell_back_from: tuple[str, ...] = ()  # endpoints passed over before the answer
    # Same-target retries before the first token: (endpoint, the failure's kind, seconds waited).
    retried: tuple[tuple[str, str, float], ...] = ()
    skipped_chunks: int = 0  # unreadable chunks of the engine's stream passed over
    continued: tuple[str, ...] = ()  # endpoints that continued the answer after a cut (metrics)
    # What it asked beyond text: observability.models.REQUEST_FEATURES' names, space-separated.
    features: str = ""
    api: str = "chat"  # chat | completions | embeddings (observability.models.RequestLog.Api)
    key: uuid.UUID = field(default_factory=uuid.uuid4)  # stores a batch written twice once
    wait_ms: float | None = None  # waiting for room at an endpoint's capacity; None: no wait
    priority: str = ""  # its class at an endpoint's capacity; "" when no model was asked
    # What the screening found, never the values (observability.models.RequestLog's): the
    # personal data types, space-separated, and where the question went with them; a suspected
    # prompt injection's kind and what came of it.
    personal_data: str = ""
    personal_data_action: str = ""
    injection: str = ""
    injection_action: str = ""


def request_note(record: RequestRecord) -> None:
    """Keep the row for the next batch; safe on the event loop (memory only, never raises)."""
    if settings.REQUEST_LOG:
        _writer.note(record)


def request_flush() -> int:
    """Write every waiting row now, in the caller's thread; the number written (tests, exit)."""
    return _writer.flush()


def request_buffer_stats() -> BufferStats:
    return _writer.stats()


def partition_name(day: date) -> str:
    return f"{TABLE}_p{day:%Y%m%d}"


def partition_ensure(day: date) -> None:
    """Create the day's partition if it is missing. Two processes may race to create it: the
    loser's error says it exists, which is all it wanted."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    sql = (
        f"CREATE TABLE IF NOT EXISTS {partition_name(day)} PARTITION OF {TABLE} "
        "FOR VALUES FROM (%s) TO (%s)"
    )
    try:
        with (
            transaction.atomic(),
            connection.cursor() as cursor,
        ):  # a failure leaves the caller's transaction usable
            cursor.execute(sql, [start, start + timedelta(days=1)])
    except (IntegrityError, ProgrammingError) as exc:
        if not isinstance(exc.__cause__, (pg_errors.UniqueViolation, pg_errors.DuplicateTable)):
            raise
    _ready.add(day)


def partitions() -> list[date]:
    """The days that have a partition, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass",
            [TABLE],
        )
        names = [row[0] for row in cursor.fetchall()]
    prefix = f"{TABLE}_p"
    return sorted(
        datetime.strptime(name.removeprefix(prefix), "%Y%m%d").date()  # noqa: DTZ007 - a partition's day, kept as a date
        for name in names
        if name.startswith(prefix)
    )


def requestlog_prune(*, now: datetime | None = None) -> list[date]:
    """Drop the days whose every row is older than REQUEST_LOG_DAYS; make today's and tomorrow's
    partitions ahead of the traffic. Returns the days dropped."""
    now = now or datetime.now(UTC)
    cutoff = (now - timedelta(days=settings.REQUEST_LOG_DAYS)).date()
    dropped = []
    for day in partitions():
        if day < cutoff:  # the day ends at or before the cutoff's midnight: all of it is older
            with connection.cursor() as cursor:
                cursor.execute(f"DROP TABLE IF EXISTS {partition_name(day)}")
            _ready.discard(day)
            dropped.append(day)
    today = now.astimezone(UTC).date()
    for day in (today, today + timedelta(days=1)):
        partition_ensure(day)
    return dropped


# Days this process knows to have a partition: a batch asks the catalogue only for new days.
_ready: set[date] = set()

# The table's columns as the writer fills them, each with its SQL type (the export reads the same
# list, observability.export).
COLUMNS = (
    ("at", "timestamptz"),
    ("interface", "text"),
    ("api", "text"),
    ("user_id", "bigint"),
    ("api_key_id", "bigint"),
    ("session_id", "bigint"),
    ("road", "text"),
    ("rule", "text"),
    ("target", "text"),
    ("status", "text"),
    ("error_code", "text"),
    ("ttft_ms", "float8"),
    ("latency_ms", "float8"),
    ("overhead_ms", "float8"),
    ("prompt_tokens", "integer"),
    ("completion_tokens", "integer"),
    ("cost", "float8"),
    ("kb_method", "text"),
    ("kb_hit", "boolean"),
    ("kb_entry_id", "bigint"),
    ("kb_score", "float8"),
    ("fallbacks", "smallint"),
    ("retries", "smallint"),
    ("retry_wait_ms", "float8"),
    ("retry_causes", "text"),
    ("skipped_chunks", "smallint"),
    ("features", "text"),
    ("request_key", "uuid"),
    ("wait_ms", "float8"),
    ("priority", "text"),
    ("personal_data", "text"),
    ("personal_data_action", "text"),
    ("injection", "text"),
    ("injection_action", "text"),
)

# One statement per batch, one array per column: the text is the same for every batch size.
_INSERT_SQL = (
    f"INSERT INTO {TABLE} ({', '.join(column for column, _ in COLUMNS)}) "  # noqa: S608 - _meta's names; values are parameters
    f"SELECT * FROM unnest({', '.join(f'%s::{sql_type}[]' for _, sql_type in COLUMNS)}) "
    "ON CONFLICT (request_key, at) DO NOTHING"
)


def _short(value: str, limit: int) -> str:
    # Names and codes only; a NUL cannot be stored in text and must not sink the batch.
    return value.replace("\x00", "")[:limit]


def _waited_ms(retried: tuple[tuple[str, str, float], ...]) -> float | None:
    return round(sum(wait for _, _, wait in retried) * 1000, 1) if retried else None


def _causes(retried: tuple[tuple[str, str, float], ...]) -> str:
    return _short(" ".join(dict.fromkeys(kind for _, kind, _ in retried)), 100)


def _write(batch: list[RequestRecord]) -> int:
    for day in {r.at.astimezone(UTC).date() for r in batch} - _ready:
        partition_ensure(day)
    columns = (
        [r.at for r in batch],
        [r.interface for r in batch],
        [r.api for r in batch],
        [r.user_id for r in batch],
        [r.api_key_id for r in batch],
        [r.session_id for r in batch],
        [r.road for r in batch],
        [_short(r.rule, 100) for r in batch],
        [_short(r.target, 100) for r in batch],
        [r.status for r in batch],
        [_short(r.error_code, 40) for r in batch],
        [r.ttft_ms for r in batch],
        [r.latency_ms for r in batch],
        [r.overhead_ms for r in batch],
        [r.prompt_tokens for r in batch],
        [r.completion_tokens for r in batch],
        [r.cost for r in batch],
        [r.kb_method for r in batch],
        [r.kb_hit for r in batch],
        [r.kb_entry_id for r in batch],
        [r.kb_score for r in batch],
        [min(len(r.fell_back_from), 32767) for r in batch],
        [min(len(r.retried), 32767) for r in batch],
        [_waited_ms(r.retried) for r in batch],
        [_causes(r.retried) for r in batch],
        [min(r.skipped_chunks, 32767) for r in batch],
        [_short(r.features, 100) for r in batch],
        [r.key for r in batch],
        [r.wait_ms for r in batch],
        [_short(r.priority, 16) for r in batch],
        [_short(r.personal_data, 100) for r in batch],
        [_short(r.personal_data_action, 16) for r in batch],
        [_short(r.injection, 40) for r in batch],
        [_short(r.injection_action, 16) for r in batch],
    )
    try:
        with (
            transaction.atomic(),
            connection.cursor() as cursor,
        ):  # a savepoint when inside a transaction
            cursor.execute(_INSERT_SQL, columns)
            return cursor.rowcount
    except IntegrityError as exc:
        if not isinstance(exc.__cause__, pg_errors.CheckViolation):
            raise
        # "no partition of relation found for row": a day this process thought ready was dropped
        # (retention ran elsewhere). Forget what it knew, make them, and write once more.
        _ready.clear()
        for day in {r.at.astimezone(UTC).date() for r in batch}:
            partition_ensure(day)
        with connection.cursor() as cursor:
            cursor.execute(_INSERT_SQL, columns)
            return cursor.rowcount


_writer: BatchWriter[RequestRecord] = BatchWriter(
    name="request log rows",
    write=_write,
    capacity=lambda: settings.REQUEST_LOG_BUFFER_ROWS,
    rows=lambda: settings.REQUEST_LOG_FLUSH_ROWS,
    interval=lambda: settings.REQUEST_LOG_FLUSH_SECONDS,
)
