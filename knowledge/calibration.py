"""Calibration of the direct answer: labelled questions through the live matcher, swept across
operating points.

The questions come from a labelled file, or from traffic (`traffic_read`): the direct answers and
the misses of the last days, with the vectors their requests computed and the verdicts people gave
(the users' thumbs and the curators' reviews; a miss a curator attached to an entry or dismissed).
A verdict counts once per person and question, and a curator's decides its question
(`verdicts_per_person`); a curator's verdict on a missed question counts once. Traffic that no one
judged counts in the hit rate, not in precision or recall.

Each question is matched once, by the same statements and guards that serve `/v1`
(`knowledge.selectors`): an exact match (or a typo of a phrasing) decides by itself; otherwise the
vector road's best
entry, its score, its lead over the runner-up and whether the guards (the words check, the near
misses) let it through. What an operating point (threshold, margin) would answer then follows
without another query, so the sweep over a grid of points costs nothing but arithmetic, and it
agrees with the live verdict at every point (tests/knowledge/test_calibration.py).

Precision counts the direct answers that are the expected entry; recall counts the answerable
questions (those with an expected entry) answered with it. A wrong direct answer is worse than
none, so the recommended point is the one with the best recall among those that reach the target
precision, and among equals the strictest.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from knowledge.exceptions import EntryInvalid
from knowledge.models import Calibration, EmbeddingModel, Entry, Feedback, Hit, Miss
from knowledge.normalize import normalize
from knowledge.selectors import (
    exact_match,
    faq_matches,
    serving_model,
    serving_model_forget,
    typo_match,
)
from knowledge.verdict import guards_refusal

logger = logging.getLogger(__name__)

KINDS = ("exact", "paraphrase", "cross_lingual", "near_miss", "out_of_domain")
# The grid: thresholds across the scales of the models we ship (E5's is compressed near 1),
# margins from none to a wide lead.
THRESHOLDS = tuple(round(0.50 + 0.005 * i, 3) for i in range(100))
MARGINS = tuple(round(0.005 * i, 3) for i in range(31))


@dataclass(frozen=True)
class Labelled:
    line: int
    question: str
    expected: int | None  # entry id
    kind: str = ""
    lang: str = ""
    # Traffic: False when no one said what answers it (it counts in the hit rate only); `wrong`,
    # an entry a person said does not answer it, the right one unknown; `vector`, the question's
    # embedding by the serving model, as its request computed it.
    judged: bool = True
    wrong: int | None = None
    vector: tuple[float, ...] | None = field(default=None, repr=False)

    def verdict(self, got: int | None) -> str | None:
        """right or wrong for the entry `got` as a direct answer; None when not answered or when
        no one said."""
        if got is None:
            return None
        if self.judged:
            return "right" if got == self.expected else "wrong"
        return "wrong" if got == self.wrong else None


@dataclass
class Evidence:
    """What the matcher found for one question, independent of the operating point."""

    item: Labelled
    exact: int | None = None  # the entry an exact match (or a typo of a phrasing) answers with
    best: int | None = None  # the vector road's best entry
    score: float = 0.0
    lead: float = 0.0
    guarded: str = ""  # why the guards refuse the best entry at any point, or ""

    def answer(self, threshold: float, margin: float) -> int | None:
        if self.exact is not None:
            return self.exact
        if self.best is None or self.guarded or self.score < threshold or self.lead < margin:
            return None
        return self.best


@dataclass(frozen=True)
class Point:
    threshold: float
    margin: float
    precision: float  # of the judged direct answers
    recall: float  # of the judged answerable questions
    answered: int
    correct: int
    wrong: int = 0
    hit_rate: float = 0.0  # direct answers among all the questions


@dataclass
class Result:
    model: EmbeddingModel
    evidence: list[Evidence]
    points: list[Point]
    target: float
    chosen: Point | None
    answerable: int
    wrong: list[dict] = field(default_factory=list)  # at the chosen point
    missed: list[dict] = field(default_factory=list)  # answerable, not answered at the chosen point

    def by_kind(self) -> dict[str, dict[str, int]]:
        """Per kind of question at the chosen point: asked, answerable, answered, correct, wrong."""
        table: dict[str, Counter] = {}
        for ev in self.evidence:
            row = table.setdefault(ev.item.kind or "-", Counter())
            row["asked"] += 1
            row["answerable"] += ev.item.expected is not None
            if self.chosen is not None:
                got = ev.answer(self.chosen.threshold, self.chosen.margin)
                verdict = ev.item.verdict(got)
                row["answered"] += got is not None
                row["correct"] += verdict == "right"
                row["wrong"] += verdict == "wrong"
        return {kind: dict(row) for kind, row in table.items()}


def labelled_read(text: str) -> list[Labelled]:
    """Parse a labelled JSONL file: {"question", "expected": entry external id, entry id or null,
    "kind", "lang"} per line. Every bad line is reported with its number; none is skipped."""
    items, errors, wanted = [], [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(f"line {number}: not JSON ({exc.msg})")
            continue
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("question"), str)
            or not normalize(row["question"])
        ):
            errors.append(f"line {number}: needs a non-empty string `question`")
            continue
        expected = row.get("expected")
        if expected is not None and (
            isinstance(expected, bool) or not isinstance(expected, str | int)
        ):
            errors.append(f"line {number}: `expected` must be an entry id, an external id or null")
            continue
        wanted.append((number, expected))
        items.append((number, row))
    ids = _entry_ids({expected for _, expected in wanted if expected is not None})
    for number, expected in wanted:
        if expected is not None and expected not in ids:
            errors.append(f"line {number}: no FAQ entry {expected!r}")
    if errors:
        raise EntryInvalid({"file": "\n".join(errors)})
    if not items:
        raise EntryInvalid({"file": "no labelled questions"})
    return [
        Labelled(
            line=number,
            question=row["question"],
            expected=ids.get(row.get("expected")),
            kind=str(row.get("kind") or ""),
            lang=str(row.get("lang") or ""),
        )
        for number, row in items
    ]


def _entry_ids(keys: set) -> dict:
    """Entry id by the key a labelled file uses: its external id (a string) or its id (a number)."""
    faq = Entry.objects.filter(kind=Entry.Kind.FAQ, active=True)
    found = dict(
        faq.filter(external_id__in=[k for k in keys if isinstance(k, str)]).values_list(
            "external_id", "id"
        )
    )
    numbers = [k for k in keys if isinstance(k, int)]
    found.update({pk: pk for pk in faq.filter(pk__in=numbers).values_list("id", flat=True)})
    return found


def evidence_of(item: Labelled, model: EmbeddingModel) -> Evidence:
    ev = Evidence(item=item)
    key = normalize(item.question)
    exact = exact_match(key) or typo_match(key)
    if exact is not None:
        ev.exact = exact.entry.pk
        return ev
    matches = faq_matches(item.question, limit=5, model=model, vector=item.vector)
    if not matches:
        return ev
    ev.best, ev.score = matches[0].entry.pk, matches[0].score
    ev.lead = matches[0].score - (matches[1].score if len(matches) > 1 else 0.0)
    ev.guarded = guards_refusal(item.question, matches) or ""
    return ev


def sweep(evidence: list[Evidence], *, thresholds=THRESHOLDS, margins=MARGINS) -> list[Point]:
    """Precision, recall and hit rate at every (threshold, margin) of the grid, in one vectorised
    pass. Precision counts the direct answers someone judged; recall, the judged answerable
    questions; the hit rate, every question."""
    exact = np.array([ev.exact is not None for ev in evidence])
    exact_right = np.array([ev.item.verdict(ev.exact) == "right" for ev in evidence])
    exact_wrong = np.array([ev.item.verdict(ev.exact) == "wrong" for ev in evidence])
    open_ = np.array(
        [ev.exact is None and ev.best is not None and not ev.guarded for ev in evidence]
    )
    right = np.array([ev.item.verdict(ev.best) == "right" for ev in evidence])
    wrong = np.array([ev.item.verdict(ev.best) == "wrong" for ev in evidence])
    score = np.array([ev.score for ev in evidence])
    lead = np.array([ev.lead for ev in evidence])
    answerable = sum(ev.item.judged and ev.item.expected is not None for ev in evidence)
    points = []
    for threshold in thresholds:
        passes_t = open_ & (score >= threshold)
        for margin in margins:
            vector = passes_t & (lead >= margin)
            answered = int(exact.sum() + vector.sum())
            correct = int(exact_right.sum() + (vector & right).sum())
            wrongly = int(exact_wrong.sum() + (vector & wrong).sum())
            judged = correct + wrongly
            points.append(
                Point(
                    threshold=threshold,
                    margin=margin,
                    answered=answered,
                    correct=correct,
                    wrong=wrongly,
                    precision=correct / judged if judged else 1.0,
                    recall=correct / answerable if answerable else 0.0,
                    hit_rate=answered / len(evidence) if evidence else 0.0,
                )
            )
    return points


def recommend(
    points: list[Point], target: float, *, near: tuple[float, float] | None = None
) -> Point | None:
    """The best recall at precision ≥ target; among equal recall the higher precision, then the
    stricter point, or with `near` (the serving point, for traffic) the point nearest to it. None
    when no point reaches the target.

    Traffic is judged only in part, and what the serving point did not answer was never shown to
    anyone: its recall is flat over most of the grid, and the strictest point of a flat stretch
    would refuse the unjudged traffic the serving point answers well. So it moves only as far as
    the verdicts ask: away from answers marked wrong, towards answers curators attached."""
    good = [p for p in points if p.precision >= target]
    if not good:
        return None
    if near is None:
        return max(good, key=lambda p: (p.recall, p.precision, p.threshold, p.margin))
    threshold, margin = near
    return max(
        good,
        key=lambda p: (
            p.recall,
            p.precision,
            -(abs(p.threshold - threshold) + abs(p.margin - margin)),
            p.threshold,
            p.margin,
        ),
    )


def curve(points: list[Point], target: float) -> list[Point]:
    """One point per threshold, the trade-off a curator reads on the chart: the margin with the
    best recall at precision ≥ target, or, where no margin reaches it, the most precise one."""
    best: dict[float, Point] = {}
    for p in points:
        held = best.get(p.threshold)
        if held is None or _curve_key(p, target) > _curve_key(held, target):
            best[p.threshold] = p
    return [best[t] for t in sorted(best)]


def _curve_key(p: Point, target: float) -> tuple:
    return (
        (True, p.recall, p.precision) if p.precision >= target else (False, p.precision, p.recall)
    )


def calibrate(
    items: list[Labelled],
    *,
    target: float = 0.98,
    model: EmbeddingModel | None = None,
    near_serving: bool = False,
) -> Result:
    """`near_serving`: among points as good, recommend the one nearest the model's serving point
    (traffic), not the strictest (a labelled file, which judges every question)."""
    model = model or serving_model()
    if model is None:
        raise EntryInvalid({"model": "no embedding model serves yet"})
    evidence = [evidence_of(item, model) for item in items]
    points = sweep(evidence)
    chosen = recommend(
        points, target, near=(model.threshold, model.margin) if near_serving else None
    )
    result = Result(
        model=model,
        evidence=evidence,
        points=points,
        target=target,
        chosen=chosen,
        answerable=sum(item.judged and item.expected is not None for item in items),
    )
    if chosen is not None:
        titles = dict(Entry.objects.values_list("id", "question"))
        for ev in evidence:
            got = ev.answer(chosen.threshold, chosen.margin)
            verdict = ev.item.verdict(got)
            row = {
                "line": ev.item.line,
                "question": ev.item.question,
                "kind": ev.item.kind,
                "expected": ev.item.expected,
                "expected_question": titles.get(ev.item.expected, ""),
                "got": got,
                "got_question": titles.get(got, ""),
                "score": round(ev.score, 4),
                "lead": round(ev.lead, 4),
                "guard": ev.guarded,
                "judged": ev.item.judged,  # False: a person said `got` is wrong, not what is right
            }
            if verdict == "wrong":
                result.wrong.append(row)
            elif got is None and ev.item.judged and ev.item.expected is not None:
                result.missed.append(row)
    return result


def calibration_save(result: Result, *, source: str, apply: bool = False) -> Calibration:
    """Keep the run for the admin's chart; with `apply`, the chosen point becomes the model's."""
    run = Calibration.objects.create(
        model=result.model,
        source=source[:200],
        target=result.target,
        questions=len(result.evidence),
        answerable=result.answerable,
        threshold=result.chosen.threshold if result.chosen else None,
        margin=result.chosen.margin if result.chosen else None,
        precision=result.chosen.precision if result.chosen else None,
        recall=result.chosen.recall if result.chosen else None,
        hit_rate=result.chosen.hit_rate if result.chosen else None,
        curve=[
            [p.threshold, p.margin, round(p.precision, 4), round(p.recall, 4)]
            for p in curve(result.points, result.target)
        ],
        wrong=result.wrong[:200],
        by_kind=result.by_kind(),
    )
    if apply and result.chosen is not None:
        run = calibration_apply(run_id=run.pk)
    return run


def calibration_apply(*, run_id: int, by=None) -> Calibration:
    """The run's recommended point becomes its model's own threshold and margin, logged with who
    applied it (`by`: a user, None for the command line). Raises EntryInvalid for a run that
    reached no point at its target precision."""
    with transaction.atomic():
        run = Calibration.objects.select_for_update().get(pk=run_id)
        if run.threshold is None or run.margin is None:
            raise EntryInvalid(
                {
                    "calibration": f"calibration #{run.pk} reached no operating point at precision "
                    f"{run.target:.2f}: there is nothing to apply"
                }
            )
        model = EmbeddingModel.objects.select_for_update().get(pk=run.model_id)
        before = (model.threshold, model.margin)
        EmbeddingModel.objects.filter(pk=run.model_id).update(
            direct_threshold=run.threshold, direct_margin=run.margin
        )
        run.applied, run.applied_at, run.applied_by = True, timezone.now(), by
        run.save(update_fields=["applied", "applied_at", "applied_by"])
    logger.warning(
        "calibration #%s applied by %s: %s answers directly at threshold %.3f, margin %.3f "
        "(was %.3f, %.3f)",
        run.pk,
        by.get_username() if by is not None else "the command line",
        model.name,
        run.threshold,
        run.margin,
        *before,
    )
    # This process answers with the new point at once; the others when their cached row expires.
    serving_model_forget()
    return run


# --- from traffic -------------------------------------------------------------------------------


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
