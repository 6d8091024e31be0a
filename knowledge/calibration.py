"""Calibration of the direct answer: labelled questions through the live matcher, swept across
operating points.

The questions come from a labelled file, or from traffic (`knowledge.calibration_traffic`): the
direct answers and the misses of the last days, with the vectors their requests computed and the
verdicts people gave (the users' thumbs and the curators' reviews; a miss a curator attached to an
entry or dismissed). A verdict counts once per person and question, and a curator's decides its
question (`verdicts_per_person`); a curator's verdict on a missed question counts once. Traffic
that no one judged counts in the hit rate, not in precision or recall.

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

A run is kept, and its point applied, by `knowledge.services.calibrations`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from knowledge.exceptions import EntryInvalid
from knowledge.models import EmbeddingModel, Entry
from knowledge.normalize import normalize
from knowledge.selectors import (
    exact_match,
    faq_matches,
    serving_model,
    typo_match,
)
from knowledge.verdict import guards_refusal

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
    found.update({pk: pk for pk in faq.filter(pk__in=numbers).values_list("id", flat=True)})  # type: ignore[misc]  # keys: external ids and numbers
    return found


def evidence_of(item: Labelled, model: EmbeddingModel) -> Evidence:
    ev = Evidence(item=item)
    key = normalize(item.question)
    exact = exact_match(key) or typo_match(key)
    if exact is not None:
        ev.exact = exact.entry.pk  # type: ignore[union-attr]  # a match has its entry
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
                "expected_question": titles.get(ev.item.expected, ""),  # type: ignore[arg-type]  # None has no title
                "got": got,
                "got_question": titles.get(got, ""),  # type: ignore[arg-type]  # None has no title
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
