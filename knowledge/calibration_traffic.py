"""Calibration's questions from traffic: the direct answers and the misses of the last days, with
the vectors their requests computed and the verdicts people gave (knowledge.calibration sweeps
them like a labelled file's)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import OuterRef, Subquery
from django.utils import timezone

from knowledge.calibration import Labelled, Result, calibrate
from knowledge.exceptions import EntryInvalid
from knowledge.models import EmbeddingModel, Feedback, Hit, Miss
from knowledge.selectors import serving_model


def traffic_read(
    *, days: int, model: EmbeddingModel, limit: int = 20000, now: datetime | None = None
) -> list[Labelled]:
    """The questions the KB judged in the last `days` days (the newest `limit` direct answers and
    misses), each with the vector its request computed when it was by `model`, and what people
    said of it (`verdicts_per_person` picks the answers whose verdict counts):

    - a direct answer: up or right says its entry answers it, down or wrong says it does not (the
      right one unknown); no verdict: not judged;
    - a miss: attached by a curator to an entry (that entry answers it), in a group a curator
      dismissed (nothing should answer it), else not judged.
    """
    if days < 1:
        raise EntryInvalid({"days": "must be at least 1"})
    since = (now or timezone.now()) - timedelta(days=days)
    thumbs = Feedback.objects.filter(request_key=OuterRef("key"))
    hits = list(
        Hit.objects.filter(created_at__gte=since, entry__isnull=False)
        .annotate(
            thumbs=Subquery(thumbs.values("verdict")[:1]),
            judge=Subquery(thumbs.values("user_id")[:1]),
            thumbs_at=Subquery(thumbs.values("updated_at")[:1]),
        )
        .order_by("-created_at")
        .values_list(
            "pk",
            "question",
            "normalized",
            "entry_id",
            "method",
            "model_id",
            "created_at",
            "review",
            "reviewed_at",
            "thumbs",
            "judge",
            "thumbs_at",
            named=True,
        )[:limit]
    )
    misses = list(
        Miss.objects.filter(created_at__gte=since)
        .order_by("-created_at")
        .values_list(
            "pk",
            "question",
            "normalized",
            "resolved_by_id",
            "group__dismissed_at",
            "dismissed_at",
            named=True,
        )[:limit]
    )
    vectors = _vectors(Hit, [h.pk for h in hits if h.model_id == model.pk], model)
    miss_vectors = _vectors(Miss, [m.pk for m in misses], model)
    said = verdicts_per_person(hits)
    items = []
    for hit in hits:
        verdict = said.get(hit.pk, "")
        items.append(
            Labelled(
                line=hit.pk,
                question=hit.question,
                expected=hit.entry_id if verdict == "right" else None,
                wrong=hit.entry_id if verdict == "wrong" else None,
                judged=verdict == "right",
                kind=f"direct ({hit.method})",
                vector=vectors.get(hit.pk),
            )
        )
    # A curator judges a missed question once, for every time it was asked (the misses come
    # newest first): it counts once, as a verdict on a direct answer does.
    counted: set[str] = set()
    for miss in misses:
        judged = miss.resolved_by_id is not None or bool(
            miss.group__dismissed_at or miss.dismissed_at
        )
        judged = judged and miss.normalized not in counted
        if judged:
            counted.add(miss.normalized)
        items.append(
            Labelled(
                line=miss.pk,
                question=miss.question,
                expected=miss.resolved_by_id if judged else None,
                judged=judged,
                kind="miss",
                vector=miss_vectors.get(miss.pk),
            )
        )
    if not items:
        raise EntryInvalid({"days": f"no questions reached the KB in the last {days} day(s)"})
    return items


def verdicts_per_person(hits) -> dict[int, str]:
    """Which direct answers carry a verdict, by hit id: "right" or "wrong". `hits`: rows with
    `pk`, `normalized`, `entry_id`, `created_at`, `review`, `reviewed_at`, and the user's thumbs
    (`thumbs`, `judge`: their user id, `thumbs_at`).

    A verdict judges a question and the entry that answered it, so it counts once per person and
    question: the answers of one normalized question with one entry are one question, and each
    person's latest verdict on any of them is their one verdict. One user's five thumbs down on a
    question asked five times are one verdict, as are their fifty thumbs up; repeating it adds
    nothing that calibration does not already know (the same question meets the same entry, at
    the same score). Where a curator reviewed the question, their latest review stands in for
    every person's verdict on it, whatever they said, so the question keeps the weight of the
    people who judged it (one verdict where no one else did). The other answers count in the hit
    rate only."""
    by_question: dict[tuple[str, int], list] = {}
    for hit in hits:
        by_question.setdefault((hit.normalized, hit.entry_id), []).append(hit)
    said: dict[int, str] = {}
    for answers in by_question.values():
        latest: dict[int | None, Any] = {}  # by person; None: users since deleted, as one
        for hit in answers:
            if not hit.thumbs:
                continue
            held = latest.get(hit.judge)
            if held is None or (hit.thumbs_at, hit.pk) > (held.thumbs_at, held.pk):
                latest[hit.judge] = hit
        reviewed = [hit for hit in answers if hit.review]
        if reviewed:
            curator = max(reviewed, key=lambda hit: (hit.reviewed_at or hit.created_at, hit.pk))
            for hit in list(latest.values()) or [curator]:
                said[hit.pk] = curator.review
            continue
        for hit in latest.values():
            said[hit.pk] = "right" if hit.thumbs == Feedback.Verdict.UP else "wrong"
    return said


def _vectors(table, ids: list[int], model: EmbeddingModel) -> dict[int, tuple[float, ...]]:
    """The stored vectors by `model` of these rows, by id."""
    rows = table.objects.filter(pk__in=ids, model=model, embedding__isnull=False)
    return {pk: tuple(map(float, vector)) for pk, vector in rows.values_list("pk", "embedding")}


def calibrate_from_traffic(
    *, days: int = 7, target: float = 0.98, limit: int = 20000, model: EmbeddingModel | None = None
) -> Result:
    model = model or serving_model()
    if model is None:
        raise EntryInvalid({"model": "no embedding model serves yet"})
    items = traffic_read(days=days, model=model, limit=limit)
    return calibrate(items, target=target, model=model, near_serving=True)


def traffic_source(days: int, result: Result) -> str:
    judged = sum(ev.item.judged or ev.item.wrong is not None for ev in result.evidence)
    return f"traffic: last {days} day(s), {len(result.evidence)} questions, {judged} judged"
