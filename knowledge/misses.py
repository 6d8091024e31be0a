"""KB misses off the hot path: noted in memory by the request, written in batches by a thread.

A request that the KB did not answer calls `miss_note` after its answer. That only appends to
a bounded in-process buffer (`core.batches.BatchWriter`): no I/O, no embedding (the request
passes the vector it already computed), no task. The buffer's thread writes one INSERT per
batch, every `KB_MISS_FLUSH_SECONDS` or sooner when `KB_MISS_FLUSH_ROWS` wait, keeping at most
`KB_MISS_BUFFER_ROWS` while the database is away. Grouping similar misses is a later, set-wise
pass (`knowledge.miss_groups.misses_group`).

A batch is written at least once and stored once: each note carries a key of its own, and the
INSERT skips keys already stored. A batch whose INSERT committed but whose answer was lost with
the connection goes back into the buffer, and its second write adds nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.utils import timezone

from core.batches import BatchWriter, BufferStats
from knowledge.embedding import vector_literal
from knowledge.normalize import normalize


@dataclass(frozen=True, slots=True)
class _Note:
    question: str
    answer: str
    best_entry_id: int | None
    best_score: float | None
    model_id: int | None
    vector: tuple[float, ...] | None
    reason: str
    noted_at: datetime
    key: uuid.UUID


MissBufferStats = BufferStats


def miss_note(
    *,
    question: str,
    answer: str,
    best_entry_id: int | None,
    best_score: float | None,
    model_id: int | None,
    vector: tuple[float, ...] | None,
    reason: str = "",
    key: uuid.UUID | None = None,
) -> None:
    """Keep a question the KB did not answer (and the answer a model gave) for the curators.

    Safe on the event loop: it appends to memory and returns. `vector` is the question's
    embedding by the model `model_id`, as the request computed it; `None` stores none. `reason`:
    why the KB did not answer it (the verdict's), for the curators. `key`: the request's, so the
    miss, the request log's row and the user's feedback name the same answer.
    """
    if not settings.KB_RECORD_MISSES:
        return
    _writer.note(
        _Note(
            question,
            answer,
            best_entry_id,
            best_score,
            model_id,
            vector,
            reason,
            timezone.now(),
            key or uuid.uuid4(),
        )
    )


def miss_flush() -> int:
    """Write every waiting miss now, in the caller's thread and database connection; the number
    written. For tests and for process exit."""
    return _writer.flush()


def miss_buffer_stats() -> BufferStats:
    return _writer.stats()


# One statement per batch. Rows are unnested from one array per column rather than spelled
# as VALUES, so the statement text is the same for every batch size. The joins keep a batch
# whole when its entry or embedding model was deleted after the request: the reference becomes
# NULL, as the foreign key's SET_NULL would have made it.
_INSERT_SQL = """
INSERT INTO knowledge_miss (question, normalized, answer, best_entry_id, best_score, reason, count,
                            embedding, model_id, created_at, grouped_at, group_id, resolved_by_id,
                            note_key)
SELECT v.question, v.normalized, v.answer, e.id, v.best_score, v.reason, 1,
       CASE WHEN m.id IS NULL THEN NULL ELSE v.embedding::vector END, m.id, v.created_at,
       NULL, NULL, NULL, v.note_key
FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::float8[], %s::text[],
            %s::text[], %s::bigint[], %s::timestamptz[], %s::uuid[]) WITH ORDINALITY
     AS v(question, normalized, answer, best_entry_id, best_score, reason, embedding, model_id,
          created_at, note_key, ordinal)
LEFT JOIN knowledge_entry e ON e.id = v.best_entry_id
LEFT JOIN knowledge_embeddingmodel m ON m.id = v.model_id
ORDER BY v.ordinal
ON CONFLICT (note_key) DO NOTHING
"""


def pg_text(value: str) -> str:
    # PostgreSQL text cannot hold NUL; one such question must not sink its batch.
    return value.replace("\x00", "")


def _write(batch: list[_Note]) -> int:
    columns = (
        [pg_text(n.question.strip()) for n in batch],
        [pg_text(normalize(n.question)) for n in batch],
        [pg_text(n.answer) for n in batch],
        [n.best_entry_id for n in batch],
        [n.best_score for n in batch],
        [pg_text(n.reason) for n in batch],
        [None if n.vector is None else vector_literal(n.vector) for n in batch],
        [None if n.vector is None else n.model_id for n in batch],
        [n.noted_at for n in batch],
        [n.key for n in batch],
    )
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_SQL, columns)
        return cursor.rowcount  # less than the batch when part of it was stored before


_writer: BatchWriter[_Note] = BatchWriter(
    name="KB misses",
    write=_write,
    capacity=lambda: settings.KB_MISS_BUFFER_ROWS,
    rows=lambda: settings.KB_MISS_FLUSH_ROWS,
    interval=lambda: settings.KB_MISS_FLUSH_SECONDS,
)
