"""Direct answers off the hot path: noted in memory by the request, written in batches by a thread.

The KB's other half of what misses are (`knowledge.misses`): a question it answered directly,
with the entry, how it matched (exact, typo, vector, rerank), the score, the lead over the
runner-up and the question's vector when the vector road computed one. These rows are what a
user's thumbs down puts in the review queue and what calibration from traffic replays
(`knowledge.calibration_traffic.traffic_read`); both count a verdict once per person and question,
the answers of one normalized question with one entry. A request only appends to a bounded buffer
(`core.batches.BatchWriter`); the INSERT skips a key stored before, so a batch written twice
stores each answer once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.db.models import BigIntegerField, Count, Exists, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from core.batches import BatchWriter, BufferStats
from knowledge.embedding import vector_literal
from knowledge.misses import pg_text
from knowledge.models import Feedback, Hit
from knowledge.normalize import normalize


@dataclass(frozen=True, slots=True)
class _Note:
    question: str
    entry_id: int
    method: str
    score: float | None
    lead: float | None
    model_id: int | None
    vector: tuple[float, ...] | None
    noted_at: datetime
    key: uuid.UUID


def hit_note(
    *,
    key: uuid.UUID,
    question: str,
    entry_id: int,
    method: str,
    score: float | None = None,
    lead: float | None = None,
    model_id: int | None = None,
    vector: tuple[float, ...] | None = None,
) -> None:
    """Keep a question the KB answered directly. Safe on the event loop: it appends to memory and
    returns. `key` is the request's (its request-log row and any feedback carry it too)."""
    if not settings.KB_RECORD_HITS:
        return
    _writer.note(
        _Note(question, entry_id, method, score, lead, model_id, vector, timezone.now(), key)
    )


def hit_flush() -> int:
    """Write every waiting direct answer now, in the caller's thread; the number written. For
    tests and for process exit."""
    return _writer.flush()


def hit_buffer_stats() -> BufferStats:
    return _writer.stats()


def hits_with_feedback(queryset: QuerySet[Hit]) -> QuerySet[Hit]:
    """`queryset` with the user's verdict and comment on each answer (None when none)."""

    def users(field: str) -> Subquery:
        return Subquery(Feedback.objects.filter(request_key=OuterRef("key")).values(field)[:1])

    return queryset.annotate(user_verdict=users("verdict"), user_comment=users("comment"))


def hits_with_reports(queryset: QuerySet[Hit]) -> QuerySet[Hit]:
    """`queryset` with `reports` on each answer: how many people's queued thumbs down are on its
    question (every answer of the same normalized question with the same entry), each person once
    however many they gave. Users since deleted count as one."""
    same_question = Hit.objects.filter(
        normalized=OuterRef(OuterRef("normalized")), entry_id=OuterRef(OuterRef("entry_id"))
    ).values("key")
    people = (
        Feedback.objects.filter(
            verdict=Feedback.Verdict.DOWN, queued=True, request_key__in=same_question
        )
        .order_by()
        .values("queued")
        .annotate(
            people=Count(
                Coalesce("user_id", Value(0), output_field=BigIntegerField()), distinct=True
            )
        )
        .values("people")
    )
    return queryset.annotate(reports=Coalesce(Subquery(people), Value(0)))


def review_queue(queryset: QuerySet[Hit] | None = None) -> QuerySet[Hit]:
    """The questions users marked wrong that no curator has judged: one row per question and entry
    answered (its newest answer with a queued thumbs down, with that user's verdict and comment),
    the most reported first (`reports`), then the newest. A curator's verdict on any answer of the
    question settles it: later thumbs down on it do not bring it back. A thumbs down past its
    user's allowance (`Feedback.queued`) neither queues a question nor adds to its reports."""
    queryset = hits_with_reports(
        hits_with_feedback(Hit.objects.all() if queryset is None else queryset)
    )
    same_question = Hit.objects.filter(
        normalized=OuterRef("normalized"), entry_id=OuterRef("entry_id")
    )
    queued = Feedback.objects.filter(verdict=Feedback.Verdict.DOWN, queued=True)
    newest = (
        same_question.filter(key__in=queued.values("request_key"))
        .order_by("-created_at", "-pk")
        .values("pk")[:1]
    )
    return (
        queryset.filter(pk=Subquery(newest))  # type: ignore[misc]  # the caller annotates reports
        .filter(~Exists(same_question.exclude(review="")))
        .order_by("-reports", "-created_at")
    )


def hits_prune(*, before) -> tuple[int, int]:
    """Retention: delete the direct answers kept from before `before`, and the verdicts given
    before it (each holds a user's question, or what they thought of an answer, no longer than the
    request log keeps the request). The numbers deleted: direct answers, verdicts."""
    hits, _ = Hit.objects.filter(created_at__lt=before).delete()
    verdicts, _ = Feedback.objects.filter(updated_at__lt=before).delete()
    return hits, verdicts


# As knowledge.misses: one statement text for every batch size, and a batch kept whole when its
# entry or embedding model was deleted meanwhile.
_INSERT_SQL = """
INSERT INTO knowledge_hit (question, normalized, entry_id, method, score, lead, embedding,
                           model_id, created_at, key, review, reviewed_by_id, reviewed_at)
SELECT v.question, v.normalized, e.id, v.method, v.score, v.lead,
       CASE WHEN m.id IS NULL THEN NULL ELSE v.embedding::vector END, m.id, v.created_at, v.key,
       '', NULL, NULL
FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[], %s::float8[], %s::float8[],
            %s::text[], %s::bigint[], %s::timestamptz[], %s::uuid[]) WITH ORDINALITY
     AS v(question, normalized, entry_id, method, score, lead, embedding, model_id, created_at,
          key, ordinal)
LEFT JOIN knowledge_entry e ON e.id = v.entry_id
LEFT JOIN knowledge_embeddingmodel m ON m.id = v.model_id
ORDER BY v.ordinal
ON CONFLICT (key) DO NOTHING
"""


def _write(batch: list[_Note]) -> int:
    columns = (
        [pg_text(n.question.strip()) for n in batch],
        [pg_text(normalize(n.question)) for n in batch],
        [n.entry_id for n in batch],
        [n.method for n in batch],
        [n.score for n in batch],
        [n.lead for n in batch],
        [None if n.vector is None else vector_literal(n.vector) for n in batch],
        [None if n.vector is None else n.model_id for n in batch],
        [n.noted_at for n in batch],
        [n.key for n in batch],
    )
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_SQL, columns)
        return cursor.rowcount


_writer: BatchWriter[_Note] = BatchWriter(
    name="KB direct answers",
    write=_write,
    capacity=lambda: settings.KB_MISS_BUFFER_ROWS,
    rows=lambda: settings.KB_MISS_FLUSH_ROWS,
    interval=lambda: settings.KB_MISS_FLUSH_SECONDS,
)
