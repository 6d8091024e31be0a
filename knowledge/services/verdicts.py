"""People's verdicts on answers: a user's thumbs up or down, a curator's review of direct
answers."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.text import text_problem
from knowledge.exceptions import EntryInvalid
from knowledge.models import Feedback, Hit

FEEDBACK_COMMENT_CHARS = 2000


def feedback_record(
    *,
    request_key,
    user_id: int | None,
    verdict: str,
    comment: str = "",
    interface: str,
    reviewable: bool = True,
) -> Feedback | None:
    """Keep a user's verdict on one answer (`up` or `down`), replacing one given before; an empty
    verdict takes it back (None). Raises EntryInvalid for a verdict or comment it cannot keep.

    A thumbs down on a direct answer puts its Hit in the review queue while its user is within
    KB_REVIEW_DOWNVOTES_PER_DAY (the row's `queued` says whether it did); past that it is kept,
    and counts in calibration as any verdict does, but it queues nothing. `reviewable` is False for
    an answer known not to be a direct one (a model's): no queue to enter, none of the allowance
    used. The default counts it, for an answer whose road is not known here (a /v1 completion:
    the KB's record of it is written a moment after it ends, and the verdict may come first)."""
    if verdict not in ("", *Feedback.Verdict.values):
        raise EntryInvalid({"verdict": "must be `up`, `down` or empty (to take it back)"})
    comment = comment.strip()
    if len(comment) > FEEDBACK_COMMENT_CHARS:
        raise EntryInvalid(
            {"comment": f"has {len(comment)} characters; the limit is {FEEDBACK_COMMENT_CHARS}"}
        )
    if problem := text_problem(comment):
        raise EntryInvalid({"comment": problem})
    if not verdict:
        Feedback.objects.filter(request_key=request_key, user_id=user_id).delete()  # type: ignore[misc]  # None: IS NULL (user is nullable)
        return None
    with transaction.atomic():
        queued = (
            verdict == Feedback.Verdict.DOWN
            and reviewable
            and _review_allowance_left(user_id=user_id, request_key=request_key)
        )
        row, _ = Feedback.objects.update_or_create(
            request_key=request_key,
            defaults={
                "user_id": user_id,
                "verdict": verdict,
                "comment": comment,
                "interface": interface,
                "queued": queued,
            },
        )
    return row


def _review_allowance_left(*, user_id: int | None, request_key) -> bool:
    """Whether `user_id` may queue one more thumbs down now (on the answer `request_key`): their
    queued thumbs down of the last 24 hours are fewer than KB_REVIEW_DOWNVOTES_PER_DAY. Call it in
    the transaction that writes the verdict."""
    mine = Feedback.objects.filter(user_id=user_id, verdict=Feedback.Verdict.DOWN, queued=True)  # type: ignore[misc]  # None: IS NULL (user is nullable)
    if mine.filter(request_key=request_key).exists():
        return True  # queued before: a new comment on it is not another thumbs down
    # One user's thumbs down sent together take turns here until the transaction ends, so each
    # counts the ones before it: a burst cannot all find the allowance unused.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"knowledge.review_allowance:{user_id}"],
        )
    since = timezone.now() - timedelta(days=1)
    used = mine.filter(updated_at__gte=since).count()
    return used < settings.KB_REVIEW_DOWNVOTES_PER_DAY


def hits_review(*, hit_ids: Iterable[int], verdict: str, curator) -> int:
    """A curator's verdict (`right` or `wrong`) on direct answers. It overrules the users' on
    every answer of the same question with the same entry and takes that question out of the review
    queue (knowledge.hits.review_queue, knowledge.calibration_traffic.verdicts_per_person). The
    number changed."""
    if verdict not in Hit.Review.values:
        raise EntryInvalid({"review": "must be `right` or `wrong`"})
    return Hit.objects.filter(pk__in=list(hit_ids)).update(
        review=verdict, reviewed_by=curator, reviewed_at=timezone.now()
    )
