"""Reads of the KB's curation loop: the most-asked questions it has no entry for, and day by day
what it answered directly, what it missed and what people said of it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db import connection

from knowledge.hits import review_queue
from observability.selectors.periods import Period


@dataclass(frozen=True)
class MissedQuestion:
    id: int  # the head of its group of misses
    question: str
    has_answer: bool  # a generated answer to turn into an entry
    asked: int  # misses in the group, ever
    asked_in_period: int
    best_entry_id: int | None
    best_score: float | None


# The heads by count come from the index miss_group_heads; each head's misses of the period from
# the primary key and the group's index, a handful of rows per head.
_MISSES_SQL = """
SELECT w.waiting, h.id, h.question, h.answer <> '', h.count,
       (SELECT count(*) FROM knowledge_miss m
        WHERE (m.id = h.id OR m.group_id = h.id)
          AND m.created_at >= %(start)s AND m.created_at < %(end)s),
       h.best_entry_id, h.best_score
FROM (SELECT count(*) AS waiting FROM knowledge_miss WHERE grouped_at IS NULL) w
LEFT JOIN LATERAL (
    SELECT id, question, answer, count, best_entry_id, best_score FROM knowledge_miss
    WHERE group_id IS NULL AND grouped_at IS NOT NULL AND resolved_by_id IS NULL
    ORDER BY count DESC, id
    LIMIT %(limit)s
) h ON true
ORDER BY h.count DESC, h.id
"""


def top_misses(period: Period, *, limit: int = 10) -> tuple[list[MissedQuestion], int]:
    """The most-asked questions the KB has no entry for yet (unresolved groups of misses, as the
    misses admin lists them), with how often each was asked in the period; and how many misses
    wait to be grouped (the misses admin groups them when it opens)."""
    with connection.cursor() as cursor:
        cursor.execute(_MISSES_SQL, {"start": period.start, "end": period.end, "limit": limit})
        rows = cursor.fetchall()
    waiting = rows[0][0] if rows else 0
    misses = [
        MissedQuestion(
            id=row[1],
            question=row[2],
            has_answer=row[3],
            asked=row[4],
            asked_in_period=row[5],
            best_entry_id=row[6],
            best_score=row[7],
        )
        for row in rows
        if row[1] is not None
    ]
    return misses, waiting


@dataclass
class LoopDay:
    day: date
    hits: int = 0  # direct answers kept (knowledge.Hit)
    misses: int = 0
    resolved: int = 0  # misses of the day a curator has since attached to an entry
    up: int = 0  # thumbs, on answers of every road
    down: int = 0
    direct_up: int = 0  # ...on direct answers
    direct_down: int = 0

    @property
    def hit_rate(self) -> float | None:
        """Direct answers among the questions the KB judged."""
        asked = self.hits + self.misses
        return self.hits / asked if asked else None

    @property
    def answerable_hit_rate(self) -> float | None:
        """Direct answers among the answerable questions: those answered directly, and the misses
        a curator has since attached to an entry (so the KB could have answered them)."""
        answerable = self.hits + self.resolved
        return self.hits / answerable if answerable else None


@dataclass
class KbLoop:
    days: list[LoopDay]
    review_open: int  # questions marked wrong that no curator has judged (the review queue)
    one_phrasing_groups: int  # open miss groups with a closest entry to attach them to
    one_phrasing_questions: int  # the questions those groups hold


_LOOP_SQL = """
SELECT 'hit', (created_at AT TIME ZONE 'UTC')::date, count(*), 0
FROM knowledge_hit WHERE created_at >= %(start)s GROUP BY 2
UNION ALL
SELECT 'miss', (created_at AT TIME ZONE 'UTC')::date, count(*),
       count(*) FILTER (WHERE resolved_by_id IS NOT NULL)
FROM knowledge_miss WHERE created_at >= %(start)s GROUP BY 2
UNION ALL
SELECT f.verdict, (f.updated_at AT TIME ZONE 'UTC')::date, count(*),
       count(*) FILTER (WHERE h.id IS NOT NULL)
FROM knowledge_feedback f LEFT JOIN knowledge_hit h ON h.key = f.request_key
WHERE f.updated_at >= %(start)s GROUP BY 1, 2
"""

_LOOP_OPEN_SQL = """
SELECT count(*), coalesce(sum(count), 0)
FROM knowledge_miss
WHERE group_id IS NULL AND grouped_at IS NOT NULL AND resolved_by_id IS NULL
  AND dismissed_at IS NULL AND best_entry_id IS NOT NULL
"""


def kb_loop(*, days: int, now: datetime) -> KbLoop:
    """The KB's loop over the last `days` days (UTC), one row per day: what it answered directly
    and what it missed, the hit rate of answerable traffic, and people's verdicts; with what waits
    for a curator now."""
    first = (now.astimezone(UTC) - timedelta(days=days - 1)).date()
    rows = {first + timedelta(days=i): LoopDay(day=first + timedelta(days=i)) for i in range(days)}
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    with connection.cursor() as cursor:
        cursor.execute(_LOOP_SQL, {"start": start})
        for kind, day, count, extra in cursor.fetchall():
            row = rows.get(day)
            if row is None:
                continue
            if kind == "hit":
                row.hits = count
            elif kind == "miss":
                row.misses, row.resolved = count, extra
            elif kind == "up":
                row.up, row.direct_up = count, extra
            else:
                row.down, row.direct_down = count, extra
        cursor.execute(_LOOP_OPEN_SQL)
        groups, questions = cursor.fetchone()
    # The review queue's own rows: one a question, each person's thumbs down once.
    review_open = review_queue().count()
    return KbLoop(
        days=list(rows.values()),
        review_open=review_open,
        one_phrasing_groups=groups,
        one_phrasing_questions=questions,
    )
