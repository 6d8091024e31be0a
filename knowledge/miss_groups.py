"""KB misses in groups for the curators: similar questions counted together, the groups kept
headed as old misses expire, and a group resolved by the entry made from it.

The misses arrive one row per question (knowledge.misses writes them in batches, off the hot
path); grouping is a later pass over many rows at once, and so is the retention. Both take the
same advisory lock: a pass cannot place a miss in a group whose head is going.
"""

from __future__ import annotations

import numpy as np
from django.db import connection, transaction
from django.utils import timezone

from knowledge.models import EmbeddingModel, Entry, Miss
from knowledge.services.entries import entry_add_phrasings, entry_create

# Heads a miss may join: grouped rows without a group whose question has no entry yet.
_HEAD = "h.group_id IS NULL AND h.grouped_at IS NOT NULL AND h.resolved_by_id IS NULL"

# The waiting misses, oldest first, each with what it could join among the existing heads:
# the first head with the same normalized question, and the nearest head of the same embedding
# model. One statement for the whole pass instead of two queries per miss.
_MISSES_WAITING_SQL = f"""
SELECT m.id, m.normalized, m.model_id, m.embedding::real[],
       (SELECT h.id FROM knowledge_miss h WHERE {_HEAD} AND h.normalized = m.normalized
        ORDER BY h.id LIMIT 1),
       near.id, near.score
FROM knowledge_miss m
LEFT JOIN LATERAL (
    SELECT h.id, 1 - (h.embedding <=> m.embedding) AS score
    FROM knowledge_miss h
    WHERE {_HEAD} AND h.model_id = m.model_id AND h.embedding IS NOT NULL
    ORDER BY h.embedding <=> m.embedding LIMIT 1
) near ON m.embedding IS NOT NULL
WHERE m.grouped_at IS NULL
ORDER BY m.id
LIMIT %s
"""  # noqa: S608 - _meta's names; values are parameters

_MISS_MEMBERS_SQL = """
UPDATE knowledge_miss m SET group_id = v.head, grouped_at = now()
FROM unnest(%s::bigint[], %s::bigint[]) AS v(id, head)
WHERE m.id = v.id
"""

_MISS_HEADS_SQL = """
UPDATE knowledge_miss m SET count = m.count + v.added, grouped_at = COALESCE(m.grouped_at, now())
FROM unnest(%s::bigint[], %s::integer[]) AS v(id, added)
WHERE m.id = v.id
"""


def misses_group(*, limit: int = 1000) -> int:
    """Place up to `limit` waiting misses, oldest first, in groups; the number placed.

    The rules of a single miss: it joins the first head with the same normalized question, else
    the nearest head of the same embedding model when their similarity reaches that model's group
    score (`EmbeddingModel.group_score`), else it heads a group of its own. Heads made earlier in
    the same pass count too, so misses that arrive together group together. Runs in one
    transaction; concurrent passes take turns on an advisory lock, so a second one finds the rows
    placed.
    """
    thresholds = {model.pk: model.group_score for model in EmbeddingModel.objects.all()}
    with transaction.atomic(), connection.cursor() as cursor:
        # A lock on the rows would not do: two passes could each make a head for the same question.
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext('knowledge.misses_group'))")
        cursor.execute(_MISSES_WAITING_SQL, [limit])
        rows = cursor.fetchall()
        if not rows:
            return 0
        pass_heads = _PassHeads(rows)
        members: dict[int, int] = {}
        added: dict[int, int] = {}
        for miss_id, key, model_id, vector, same_id, near_id, near_score in rows:
            head = same_id or pass_heads.by_key.get(key)
            if head is None and vector is not None:
                candidates = [(near_score, near_id)] if near_id is not None else []
                candidates.append(pass_heads.nearest(model_id, vector))
                score, nearest = max(candidates, key=lambda c: c[0])
                if nearest is not None and score >= thresholds.get(model_id, 1.0):
                    head = nearest
            if head is None:
                pass_heads.add(miss_id, key, model_id, vector)
                added.setdefault(miss_id, 0)
            else:
                members[miss_id] = head
                added[head] = added.get(head, 0) + 1
        cursor.execute(_MISS_MEMBERS_SQL, [list(members), list(members.values())])
        cursor.execute(_MISS_HEADS_SQL, [list(added), list(added.values())])
    return len(rows)


class _PassHeads:
    """The heads made so far in one grouping pass, by normalized question and by vector."""

    def __init__(self, rows):
        self.by_key: dict[str, int] = {}
        # One preallocated matrix of unit vectors per model, filled as heads appear.
        sizes: dict[int, tuple[int, int]] = {}
        for _, _, model_id, vector, *_ in rows:
            if vector is not None:
                count, _dims = sizes.get(model_id, (0, len(vector)))
                sizes[model_id] = (count + 1, len(vector))
        self._vectors = {
            model_id: np.empty((count, dims), dtype=np.float32)
            for model_id, (count, dims) in sizes.items()
        }
        self._ids: dict[int, list[int]] = {model_id: [] for model_id in sizes}

    def add(self, miss_id: int, key: str, model_id: int | None, vector) -> None:
        self.by_key.setdefault(key, miss_id)
        if vector is None:
            return
        ids = self._ids[model_id]  # type: ignore[index]  # a saved row's pk
        self._vectors[model_id][len(ids)] = _unit(vector)  # type: ignore[index]  # a saved row's pk
        ids.append(miss_id)

    def nearest(self, model_id: int | None, vector) -> tuple[float, int | None]:
        ids = self._ids.get(model_id)  # type: ignore[arg-type]  # a saved row's pk
        if not ids:
            return -1.0, None
        scores = self._vectors[model_id][: len(ids)] @ _unit(vector)  # type: ignore[index]  # a saved row's pk
        best = int(np.argmax(scores))
        return float(scores[best]), ids[best]


def _unit(vector) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float32)
    norm = np.linalg.norm(array)
    return array / norm if norm else array


# Retention. A group whose first miss expires is headed from then on by its oldest remaining
# member, so its count and place in the curators' list carry on rather than breaking into
# groups of one. Heirs are chosen before the delete, while the expiring heads are still there.
_MISS_HEIRS_SQL = """
WITH heirs AS (
    SELECT m.group_id AS head, min(m.id) AS heir
    FROM knowledge_miss m JOIN knowledge_miss h ON h.id = m.group_id
    WHERE h.created_at < %(before)s AND m.created_at >= %(before)s
    GROUP BY m.group_id
), moved AS (
    UPDATE knowledge_miss m SET group_id = NULLIF(heirs.heir, m.id)
    FROM heirs WHERE m.group_id = heirs.head AND m.created_at >= %(before)s
)
SELECT heir FROM heirs
"""

_MISS_EXPIRED_SQL = """
WITH gone AS (DELETE FROM knowledge_miss WHERE created_at < %(before)s RETURNING group_id)
SELECT count(*), array_agg(DISTINCT group_id) FILTER (WHERE group_id IS NOT NULL) FROM gone
"""

_MISS_RECOUNT_SQL = """
UPDATE knowledge_miss h
SET count = 1 + (SELECT count(*) FROM knowledge_miss m WHERE m.group_id = h.id)
WHERE h.id = ANY(%s::bigint[]) AND h.group_id IS NULL
"""


def misses_prune(*, before) -> int:
    """Delete the misses noted before `before` (a user's question and the answer a model gave
    are kept no longer than the request log keeps the request); the number deleted. The groups
    they leave are recounted and keep a head. One transaction, under the grouping pass's lock:
    a pass cannot place a miss in a group whose head is going."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext('knowledge.misses_group'))")
        cursor.execute(_MISS_HEIRS_SQL, {"before": before})
        heirs = [row[0] for row in cursor.fetchall()]
        cursor.execute(_MISS_EXPIRED_SQL, {"before": before})
        deleted, touched = cursor.fetchone()
        if heirs or touched:
            cursor.execute(_MISS_RECOUNT_SQL, [heirs + (touched or [])])
    return deleted


def miss_to_entry(
    *, miss: Miss, question: str | None = None, answer: str | None = None, author=None
) -> Entry:
    """Turn a missed question and its generated answer into a KB entry; resolves its group.

    The entry starts inactive and awaiting review: any user can put a question at the top of the
    misses by repeating it, and the answer is whatever they steered a model to say. No one gets
    it until a curator activates it, which marks it reviewed."""
    with transaction.atomic():
        entry = entry_create(
            question=question or miss.question,
            answer=answer or miss.answer,
            author=author,
            active=False,
            needs_review=True,
        )
        head = miss.group or miss
        Miss.objects.filter(pk=head.pk).update(resolved_by=entry)
        Miss.objects.filter(group=head).update(resolved_by=entry)
    return entry


def miss_group_to_phrasings(*, miss: Miss, entry: Entry, embed: str = "async") -> list[str]:
    """Attach the questions of `miss`'s group to `entry` as phrasings and resolve the group: the
    KB answers them, and every later question in their words, directly from now on. The
    questions added (one per wording; those the KB already has are left out)."""
    head = miss.group or miss
    questions = list(
        Miss.objects.filter(pk=head.pk)
        .values_list("question", flat=True)
        .union(Miss.objects.filter(group=head).values_list("question", flat=True))
    )
    with transaction.atomic():
        added = entry_add_phrasings(entry=entry, texts=sorted(questions), embed=embed)
        Miss.objects.filter(pk=head.pk).update(resolved_by=entry)
        Miss.objects.filter(group=head).update(resolved_by=entry)
    return added


def miss_groups_dismiss(*, heads: list[Miss]) -> int:
    """Mark the groups of `heads` as decided against: the KB should not answer them (out of
    domain, a near miss, a question for a person). They leave the curators' list; the number
    dismissed."""
    return Miss.objects.filter(
        pk__in=[(miss.group_id or miss.pk) for miss in heads], dismissed_at__isnull=True
    ).update(dismissed_at=timezone.now())
