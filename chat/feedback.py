"""Users' thumbs on answers, from every interface: the chat page and the DRF API name a stored
message, the /v1 API the completion id it returned.

An answer is named by its request's key (chat.turns.run_turn): the key is on the request log's
row, on the KB's record of a direct answer (knowledge.Hit) and on the stored message, and the
verdict is kept under it (knowledge.Feedback). A /v1 completion id carries the key and a
signature of it for the key's user, so a verdict on a completion needs no lookup to prove it is
the caller's own answer: the answer may not even be stored (a /v1 call outside a session), and
the request log is written a moment after the answer ends.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import uuid

from django.conf import settings
from django.db import transaction

from chat.exceptions import AnswerNotFinished, SessionNotFound
from chat.models import Message
from knowledge.models import Feedback
from knowledge.services.verdicts import feedback_record

_PREFIX = "chatcmpl-"
_SIGNATURE_CHARS = 16  # 64 bits of HMAC-SHA256: a forgery is a guess in 2**64


@functools.cache
def _secret() -> bytes:
    return hashlib.sha256(b"chat.feedback.completion-id" + settings.SECRET_KEY.encode()).digest()


def _signature(key_hex: str, user_id: int) -> str:
    mac = hmac.new(_secret(), f"{user_id}:{key_hex}".encode(), hashlib.sha256)
    return mac.hexdigest()[:_SIGNATURE_CHARS]


def completion_id(key: uuid.UUID, user_id: int) -> str:
    """The /v1 id of the answer with request key `key`, for the user `user_id`."""
    return f"{_PREFIX}{key.hex}{_signature(key.hex, user_id)}"


def completion_key(completion: str, user_id: int) -> uuid.UUID | None:
    """The request key inside a completion id this server gave `user_id`, or None (not one of its
    ids, or another user's)."""
    body = completion.removeprefix(_PREFIX)
    if body == completion or len(body) != 32 + _SIGNATURE_CHARS:
        return None
    key_hex, signature = body[:32], body[32:]
    try:
        key = uuid.UUID(hex=key_hex)
    except ValueError:
        return None
    if not hmac.compare_digest(signature, _signature(key_hex, user_id)):
        return None
    return key


def feedback_give(
    *,
    user,
    request_key: uuid.UUID,
    verdict: str,
    comment: str,
    interface: str,
    reviewable: bool = True,
) -> Feedback | None:
    """Keep `user`'s verdict on the answer `request_key` and show it on its stored message, if
    there is one; the verdict kept (None when taken back). `reviewable`: False for an answer known
    to be a model's (knowledge.services.verdicts.feedback_record). Raises EntryInvalid for a verdict
    or comment it cannot keep."""
    with transaction.atomic():
        row = feedback_record(
            request_key=request_key,
            user_id=user.pk,
            verdict=verdict,
            comment=comment,
            interface=interface,
            reviewable=reviewable,
        )
        Message.objects.filter(
            request_key=request_key, session__user=user, role=Message.Role.ASSISTANT
        ).update(verdict=verdict)
    return row


def message_feedback(
    *, user, message_id: int, verdict: str, comment: str, interface: str
) -> tuple[Message, str]:
    """The verdict on one of `user`'s stored answers: the message, and what its user should know
    of the verdict ("", or why their thumbs down on a direct answer goes to no curator). Raises
    SessionNotFound for a message that is not theirs (or not an answer), AnswerNotFinished while
    it is being written."""
    with transaction.atomic():
        message = (
            Message.objects.select_for_update()
            .filter(pk=message_id, session__user=user, role=Message.Role.ASSISTANT)
            .first()
        )
        if message is None:
            raise SessionNotFound(f"You have no answer {message_id}.")
        if message.status == Message.Status.STREAMING:
            raise AnswerNotFinished("The answer is still being written; rate it when it ends.")
        if message.request_key is None:  # stored before answers had keys
            message.request_key = uuid.uuid4()
            message.save(update_fields=["request_key"])
        direct = message.road == "kb"
        row = feedback_give(
            user=user,
            request_key=message.request_key,
            verdict=verdict,
            comment=comment,
            interface=interface,
            reviewable=direct,
        )
    message.verdict = verdict
    return message, _review_note(row) if direct else ""


def _review_note(row: Feedback | None) -> str:
    """Why a thumbs down on a direct answer went to no curator, or ""."""
    if row is None or row.verdict != Feedback.Verdict.DOWN or row.queued:
        return ""
    allowance = settings.KB_REVIEW_DOWNVOTES_PER_DAY
    if not allowance:
        return "Your 👎 is kept; users' verdicts are not sent to reviewers here."
    return (
        f"Your 👎 is kept, but it goes to no reviewer: you have sent {allowance} answer(s) for "
        "review in the last 24 hours, the most we take from one person."
    )
