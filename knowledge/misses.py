"""KB misses off the hot path: noted in memory by the request, written in batches by a thread.

A request that the KB did not answer calls `miss_note` after its answer. That only appends to
a bounded in-process buffer: no I/O, no embedding (the request passes the vector it already
computed), no task. A daemon thread of each process writes what waits in one INSERT per batch,
every `KB_MISS_FLUSH_SECONDS` or sooner when `KB_MISS_FLUSH_ROWS` wait, and closes its database
connection after each batch so it never keeps one from the pool. Grouping similar misses is a
later, set-wise pass (`knowledge.services.misses_group`).

These are analytics: when the database is away the buffer keeps the newest
`KB_MISS_BUFFER_ROWS` misses and counts the ones it drops; nothing here ever raises into a request.

A batch is written at least once and stored once: each note carries a key of its own, and the
INSERT skips keys already stored. A batch whose INSERT committed but whose answer was lost with
the connection goes back into the buffer, and its second write adds nothing.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone

from knowledge.embeddings import vector_literal
from knowledge.normalize import normalize

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Note:
    question: str
    answer: str
    best_entry_id: int | None
    best_score: float | None
    model_id: int | None
    vector: tuple[float, ...] | None
    noted_at: datetime
    key: uuid.UUID


@dataclass(frozen=True)
class MissBufferStats:
    buffered: int  # waiting in this process
    written: int  # rows written since the process started
    dropped: int  # lost since the process started: the buffer was full, or a batch was refused


_lock = threading.Lock()  # guards the buffer and the counters; held for a few operations only
_buffer: deque[_Note] = deque()
_oldest_at = 0.0  # monotonic time of the oldest note waiting
_written = 0
_dropped = 0
# One writer at a time, so `miss_flush` also waits for a batch the thread has in flight.
_write_lock = threading.Lock()
_wake = threading.Event()
_flusher: threading.Thread | None = None


def miss_note(*, question: str, answer: str, best_entry_id: int | None, best_score: float | None,
              model_id: int | None, vector: tuple[float, ...] | None) -> None:
    """Keep a question the KB did not answer (and the answer a model gave) for the curators.

    Safe on the event loop: it appends to memory and returns. `vector` is the question's
    embedding by the model `model_id`, as the request computed it; `None` stores none.
    """
    global _oldest_at, _dropped
    if not settings.KB_RECORD_MISSES:
        return
    note = _Note(question, answer, best_entry_id, best_score, model_id, vector, timezone.now(), uuid.uuid4())
    capacity = settings.KB_MISS_BUFFER_ROWS
    with _lock:
        if not _buffer:
            _oldest_at = time.monotonic()
        while len(_buffer) >= capacity:
            _buffer.popleft()
            _dropped += 1
        _buffer.append(note)
        waiting = len(_buffer)
    if _flusher is None:
        _flusher_start()
    if waiting == 1 or waiting >= settings.KB_MISS_FLUSH_ROWS:
        _wake.set()


def miss_flush() -> int:
    """Write every waiting miss now, in the caller's thread and database connection; the number
    written. For tests and for process exit. Database errors are raised to the caller (the
    misses of a batch that hit an unreachable database go back into the buffer)."""
    written = 0
    while True:
        with _write_lock:
            batch = _take(settings.KB_MISS_FLUSH_ROWS)
            if not batch:
                return written
            written += _write(batch)


def miss_buffer_stats() -> MissBufferStats:
    with _lock:
        return MissBufferStats(buffered=len(_buffer), written=_written, dropped=_dropped)


def _take(limit: int) -> list[_Note]:
    # `_oldest_at` stays as it is: the notes left behind are younger, so at worst the next
    # batch leaves a little early.
    with _lock:
        return [_buffer.popleft() for _ in range(min(limit, len(_buffer)))]


def _due_in() -> float | None:
    """Seconds until the waiting misses are due for a batch (0: now); None when none wait."""
    with _lock:
        if not _buffer:
            return None
        if len(_buffer) >= settings.KB_MISS_FLUSH_ROWS:
            return 0.0
        return max(0.0, _oldest_at + settings.KB_MISS_FLUSH_SECONDS - time.monotonic())


# One statement per batch. Rows are unnested from one array per column rather than spelled
# as VALUES, so the statement text is the same for every batch size. The joins keep a batch
# whole when its entry or embedding model was deleted after the request: the reference becomes
# NULL, as the foreign key's SET_NULL would have made it.
_INSERT_SQL = """
INSERT INTO knowledge_miss (question, normalized, answer, best_entry_id, best_score, count, embedding,
                            model_id, created_at, grouped_at, group_id, resolved_by_id, note_key)
SELECT v.question, v.normalized, v.answer, e.id, v.best_score, 1,
       CASE WHEN m.id IS NULL THEN NULL ELSE v.embedding::vector END, m.id, v.created_at, NULL, NULL, NULL,
       v.note_key
FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::float8[], %s::text[], %s::bigint[],
            %s::timestamptz[], %s::uuid[]) WITH ORDINALITY
     AS v(question, normalized, answer, best_entry_id, best_score, embedding, model_id, created_at, note_key,
          ordinal)
LEFT JOIN knowledge_entry e ON e.id = v.best_entry_id
LEFT JOIN knowledge_embeddingmodel m ON m.id = v.model_id
ORDER BY v.ordinal
ON CONFLICT (note_key) DO NOTHING
"""


def _text(value: str) -> str:
    # PostgreSQL text cannot hold NUL; one such question must not sink its batch.
    return value.replace("\x00", "")


def _write(batch: list[_Note]) -> int:
    """Insert one batch. A lost database puts the batch back to be tried again; a batch the
    database refuses is dropped and counted, so one bad row cannot block the buffer forever."""
    global _written, _dropped
    columns = (
        [_text(n.question.strip()) for n in batch],
        [_text(normalize(n.question)) for n in batch],
        [_text(n.answer) for n in batch],
        [n.best_entry_id for n in batch],
        [n.best_score for n in batch],
        [None if n.vector is None else vector_literal(n.vector) for n in batch],
        [None if n.vector is None else n.model_id for n in batch],
        [n.noted_at for n in batch],
        [n.key for n in batch],
    )
    try:
        with connection.cursor() as cursor:
            cursor.execute(_INSERT_SQL, columns)
            stored = cursor.rowcount  # less than the batch when part of it was stored before
    except (OperationalError, InterfaceError):
        _requeue(batch)
        raise
    except Exception:
        with _lock:
            _dropped += len(batch)
        raise
    with _lock:
        _written += stored
    return stored


def _requeue(batch: list[_Note]) -> None:
    global _dropped, _oldest_at
    capacity = settings.KB_MISS_BUFFER_ROWS
    with _lock:
        _buffer.extendleft(reversed(batch))
        while len(_buffer) > capacity:
            _buffer.popleft()
            _dropped += 1
        _oldest_at = time.monotonic()


def _run() -> None:
    reported = miss_buffer_stats().dropped
    while True:
        wait = _due_in()
        if wait is None or wait > 0:
            # Woken early by the first note into an empty buffer and by a full batch.
            _wake.wait(timeout=wait if wait is not None else settings.KB_MISS_FLUSH_SECONDS)
            _wake.clear()
            continue
        if not _thread_batch():
            # Whatever broke (the database, most likely) gets an interval before the next try.
            time.sleep(settings.KB_MISS_FLUSH_SECONDS)
        dropped = miss_buffer_stats().dropped
        if dropped > reported:
            logger.warning("%d KB misses dropped (buffer full or batch refused); %d in all",
                           dropped - reported, dropped)
            reported = dropped


def _thread_batch() -> bool:
    """One batch from the flusher thread; False when it failed (and was logged)."""
    ok = True
    try:
        with _write_lock:
            batch = _take(settings.KB_MISS_FLUSH_ROWS)
            if batch:
                _write(batch)
    except Exception:  # noqa: BLE001 - analytics must never take the thread down
        logger.warning("could not write a batch of KB misses", exc_info=True)
        ok = False
    try:
        # Back to the pool after each batch: this thread sleeps most of the time.
        connection.close()
    except Exception:  # noqa: BLE001
        logger.warning("could not close the KB-miss writer's connection", exc_info=True)
    return ok


def _flusher_start() -> None:
    global _flusher
    with _lock:
        if _flusher is not None:
            return
        _flusher = threading.Thread(target=_run, name="kb-miss-flusher", daemon=True)
    try:
        _flusher.start()
    except RuntimeError:  # no thread to be had: the next note tries again, the request goes on
        logger.warning("could not start the KB-miss writer", exc_info=True)
        _flusher = None


def _flush_at_exit() -> None:
    try:
        miss_flush()
    except Exception:  # noqa: BLE001 - the process is leaving; say what was lost
        logger.warning("could not write %d KB misses at exit", miss_buffer_stats().buffered, exc_info=True)


def _forget_after_fork() -> None:
    # A forked child has the parent's buffer contents but not its thread: start afresh.
    global _flusher, _lock, _write_lock, _wake, _oldest_at
    _lock, _write_lock, _wake = threading.Lock(), threading.Lock(), threading.Event()
    _buffer.clear()
    _oldest_at = 0.0
    _flusher = None


atexit.register(_flush_at_exit)
os.register_at_fork(after_in_child=_forget_after_fork)
