"""New versions of a session's last exchange: its answer regenerated, or its question edited and
sent again. The replaced messages are kept, superseded; the turn then runs as any other
(chat.turns)."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from chat.exceptions import AnswerNotFinished, MessageInvalid, NotLastExchange, SessionNotFound
from chat.history import history_kept, history_replay
from chat.models import ChatSession, Message
from chat.services import TurnStart
from core import db


def turn_redo_start(*, user, message_id: int, content: str | None) -> TurnStart:
    """Start a new version of the session's last exchange, as `aturn_start` starts a turn:
    regenerate (`message_id` the last answer, `content` None: its question is answered again) or
    edit and resend (`message_id` the last question, `content` its new text, already validated).

    The replaced messages are kept, superseded, and the new ones name the first version
    (`version_of`): the page shows the versions, and the history of later turns reads the current
    ones only. Only the last exchange: an earlier one was the ground of the turns after it.
    Raises SessionNotFound for a message that is not the user's, MessageInvalid for the wrong
    role, NotLastExchange for an earlier exchange and AnswerNotFinished while it is being written.
    """
    regenerate = content is None
    wanted = Message.Role.ASSISTANT if regenerate else Message.Role.USER
    with transaction.atomic():
        message = Message.objects.filter(pk=message_id, session__user=user).first()
        if message is None:
            raise SessionNotFound(f"You have no message {message_id}.")
        if message.role != wanted:
            raise MessageInvalid(
                "Only an answer can be regenerated."
                if regenerate
                else "Only a question can be edited and sent again."
            )
        # The session's row lock orders this against the session's other turns, whose start
        # updates the same row.
        session = ChatSession.objects.select_for_update().get(pk=message.session_id)
        last = list(session.messages.filter(superseded=False).order_by("-created_at", "-pk")[:2])
        answer, question = [*last, None, None][:2]
        if (
            answer is None
            or question is None
            or answer.role != Message.Role.ASSISTANT
            or question.role != Message.Role.USER
            or message.pk not in (answer.pk, question.pk)
        ):
            raise NotLastExchange(
                "Only the last answer can be regenerated, and only the last question edited: "
                "the turns after an earlier one were answered in view of it."
            )
        if answer.status == Message.Status.STREAMING:
            raise AnswerNotFinished("The answer is still being written; stop it or let it end.")
        replaced = [answer.pk] if regenerate else [answer.pk, question.pk]
        Message.objects.filter(pk__in=replaced).update(superseded=True)
        if not regenerate:
            question = Message.objects.create(  # type: ignore[misc]  # an edit carries its text
                session=session,
                role=Message.Role.USER,
                content=content,
                status=Message.Status.COMPLETE,
                version_of_id=question.version_of_id or question.pk,
            )
        new_answer = Message.objects.create(
            session=session,
            role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING,
            version_of_id=answer.version_of_id or answer.pk,
        )
        session.save(update_fields=["updated_at"])
        replayable = (
            session.messages.filter(superseded=False, created_at__lte=question.created_at)
            .exclude(pk__in=[question.pk, new_answer.pk])
            .exclude(status=Message.Status.STREAMING)
            .exclude(content="")
        )
        earlier = list(
            replayable.order_by("-created_at", "-pk").values_list("role", "content", "context")[
                : settings.CHAT_HISTORY_TURNS
            ]
        )[::-1]
        earlier = history_kept(earlier, replayable.count())
        groups = frozenset(user.groups.values_list("name", flat=True))
    return TurnStart(
        session_id=session.pk,
        title=session.title,
        assistant_id=new_answer.pk,
        history=history_replay(earlier),
        groups=groups,
        question_id=question.pk,
        question=question.content,
    )


async def aturn_redo_start(*, user, message_id: int, content: str | None) -> TurnStart:
    """turn_redo_start from async code. In a thread, in a transaction: rarer than a question, it
    is not on the hot path, and the checks read the rows they lock."""
    return await db.run(turn_redo_start, user=user, message_id=message_id, content=content)
