"""The vector road's verdict: what a match is, what the verdict on a question says, and how the
matches (best first) and an operating point decide it. No I/O: the selectors run it on the
matches they read, calibration replays it across operating points, and the reranker asks it
which refusals stand whatever the reranker would say."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from knowledge.guards import near_miss
from knowledge.models import EmbeddingModel, Entry
from knowledge.normalize import has_cjk, lexical_similarity


@dataclass
class Match:
    entry: Entry
    score: float
    phrasing: str = ""
    lexical: float | None = None
    texts: tuple[str, ...] = ()  # every phrasing of the entry, for the lexical check


@dataclass
class DirectAnswer:
    hit: bool
    # exact | vector | rerank | none | follow_up (a match held back: the question needs its
    # conversation)
    method: str
    reason: str
    entry: Entry | None = None
    score: float | None = None
    runner_up: Match | None = None
    matches: list[Match] = field(default_factory=list)
    threshold: float | None = None
    margin: float | None = None
    # The question's embedding and its model, when the vector road ran: reused by the rules,
    # the context retrieval and the miss record instead of embedding the question again.
    vector: tuple[float, ...] | None = None
    model: EmbeddingModel | None = None


def vector_verdict(
    text: str, matches: list[Match], *, threshold: float, margin: float
) -> DirectAnswer:
    """The vector road's verdict on `matches` (best first) at an operating point: the best must
    reach `threshold` (or its entry's own), lead the runner-up by `margin`, agree with the words,
    and not be a near miss. No I/O: calibration replays it across operating points."""
    if not matches:
        return DirectAnswer(hit=False, method="none", reason="no FAQ entry has a current embedding")
    best = matches[0]
    if len(text) > settings.KB_DIRECT_MAX_CHARS:
        return DirectAnswer(
            hit=False,
            method="vector",
            entry=best.entry,
            score=best.score,
            matches=matches,
            reason=(
                f"the question is {len(text)} characters long (KB_DIRECT_MAX_CHARS is "
                f"{settings.KB_DIRECT_MAX_CHARS}): a prompt, not a stand-alone FAQ question"
            ),
        )
    runner_up = matches[1] if len(matches) > 1 else None
    threshold = best.entry.threshold if best.entry.threshold is not None else threshold
    lead = best.score - (runner_up.score if runner_up else 0.0)
    common: dict[str, Any] = dict(
        method="vector",
        entry=best.entry,
        score=best.score,
        runner_up=runner_up,
        matches=matches,
        threshold=threshold,
        margin=lead,
    )
    if best.score < threshold:
        return DirectAnswer(
            hit=False,
            reason=f"best score {best.score:.3f} is below the threshold {threshold:.3f}",
            **common,
        )
    if lead < margin:
        return DirectAnswer(
            hit=False,
            reason=(
                f"KB#{runner_up.entry.pk} scores {runner_up.score:.3f}, too close to the best "  # type: ignore[union-attr]  # a lead under the margin has a runner-up
                f"{best.score:.3f} (margin {lead:.3f} < {margin:.3f})"
            ),
            **common,
        )
    if runner_up is not None:
        _lexical_fill(text, [best, runner_up])
        words = (best.lexical, runner_up.lexical)
        if None not in words and runner_up.lexical > best.lexical + LEXICAL_EDGE:  # type: ignore[operator]  # None not in words
            # The embedding prefers one entry, the words another: the near-miss case
            # ("cancel my subscription" vs "cancel my order", 订阅 vs 订单). Not sure means no.
            return DirectAnswer(
                hit=False,
                reason=(
                    f"the words match KB#{runner_up.entry.pk} better ({runner_up.lexical:.2f} vs "
                    f"{best.lexical:.2f}) than the embedding's choice"
                ),
                **common,
            )
    if why := near_miss(text, best.phrasing or best.entry.question):
        return DirectAnswer(hit=False, reason=f"a near miss of KB#{best.entry.pk}: {why}", **common)
    return DirectAnswer(
        hit=True,
        reason=(
            f"score {best.score:.3f} ≥ threshold {threshold:.3f}, "
            f"margin {lead:.3f} over the runner-up"
        ),
        **common,
    )


def guards_refusal(text: str, matches: list[Match]) -> str | None:
    """Why the vector road refuses the best of `matches` at any operating point (the question's
    length, an entry's own threshold, the words check, a near miss), or None: the verdict at
    threshold and margin 0 runs only those. For calibration's replay and the second stage."""
    verdict = vector_verdict(text, matches, threshold=0.0, margin=0.0)
    return None if verdict.hit else verdict.reason


# How much better the words must match the runner-up than the embedding's choice for the words to
# overrule it: a hair's difference between two paraphrases is noise, not a near miss.
LEXICAL_EDGE = 0.1


def _lexical_fill(text: str, matches: list[Match]) -> None:
    """Best lexical similarity of `text` to any phrasing of each match's entry in the question's
    script (once per match). Words cannot compare a Chinese question with an English-only entry:
    such a match keeps None, and the words check leaves the verdict to the vectors."""
    cjk = has_cjk(text)
    for match in matches:
        if match.lexical is None:
            scores = [lexical_similarity(text, t) for t in match.texts if has_cjk(t) == cjk]
            match.lexical = max(scores) if scores else None
