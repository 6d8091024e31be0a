"""What the knowledge base keeps of an answer for its curators: a direct answer as a hit, a
question it did not answer as a miss, each with the vector the request already computed; buffered
in memory and written in batches, never awaited on the answer's way. Personal data in them is kept
as typed placeholders (privacy.redaction.for_curators): curators read `[PHONE_1]`, never the
number.
"""

from __future__ import annotations

from knowledge.hits import hit_note
from knowledge.misses import miss_note
from knowledge.verdict import DirectAnswer
from privacy.redaction import for_curators
from routing.events import RouteRequest


def record_miss(
    request: RouteRequest, question: str, answer_text: str, direct: DirectAnswer
) -> None:
    """Keep the question (and the generated answer) as a KB miss for curators, with the vector
    this request already computed: buffered in memory, written in batches, never awaited. A
    follow-up is no miss: it needs its conversation, no entry could answer it on its own. A turn
    that stores nothing keeps no copy of the question here either."""
    if direct.method == "follow_up" or not request.store:
        return
    question, answer_text = for_curators(question, answer_text)
    miss_note(
        question=question,
        answer=answer_text,
        best_entry_id=direct.entry.pk if direct.entry else None,
        best_score=direct.score,
        model_id=direct.model.pk if direct.model else None,
        vector=direct.vector,
        reason=direct.reason,
        key=request.key,
    )


def record_hit(request: RouteRequest, question: str, direct: DirectAnswer, entry_id: int) -> None:
    """Keep the direct answer for the review queue and calibration from traffic, with the vector
    this request computed (the exact and typo roads compute none): buffered, never awaited."""
    if request.key is None or not request.store:
        return
    (question,) = for_curators(question)
    lead = None
    if direct.score is not None:
        lead = direct.score - (direct.runner_up.score if direct.runner_up else 0.0)
    hit_note(
        key=request.key,
        question=question,
        entry_id=entry_id,
        method=direct.method,
        score=direct.score,
        lead=lead,
        model_id=direct.model.pk if direct.model else None,
        vector=direct.vector,
    )
