"""The chat API's messages: a session's conversation, and a turn run to its end (a new question,
the last answer regenerated, the last question edited), its reply the finished turn."""

from __future__ import annotations

from asgiref.sync import async_to_sync
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from chat import selectors
from chat.api.sessions import SessionSerializer
from chat.api.turn_input import RegenerateSerializer, SendSerializer, details, turn_asked
from chat.auth import ChatScope
from chat.exceptions import SPEND_REFUSALS, SpendRefused
from chat.models import Message
from chat.turn_request import TurnRequest
from chat.turns import SessionEvent, run_turn
from routing.events import Error, message_for_users


class MessageSerializer(serializers.ModelSerializer):
    """A stored message. Its `error` keeps an engine failure's details for the admin; a caller who
    may not read them (context `details` false or missing) gets the plain message, as its stream
    did."""

    kb_entry_id = serializers.IntegerField(read_only=True)

    class Meta:
        model = Message
        fields = [
            "id",
            "role",
            "content",
            "status",
            "road",
            "rule",
            "target",
            "kb_entry_id",
            "ttft_ms",
            "latency_ms",
            "prompt_tokens",
            "completion_tokens",
            "citations",
            "error",
            "verdict",
            "version_of",
            "superseded",
            "created_at",
        ]
        extra_kwargs = {
            "version_of": {
                "help_text": "The first version of this message, when it is a later one "
                "(a regenerated answer, an edited question)."
            },
            "superseded": {
                "help_text": "A version a later one replaced; the conversation goes on from the "
                "current ones."
            },
        }

    def to_representation(self, instance):
        data = super().to_representation(instance)
        if data["error"] and not self.context.get("details"):
            # Stored as "code: message" (services.aturn_finish).
            code, _, message = data["error"].partition(": ")
            plain = message_for_users(
                code, message, partial=instance.status == Message.Status.PARTIAL
            )
            if plain != message:
                data["error"] = (
                    plain  # the code too names the failure ("connect", "timeout_idle", …)
                )
        return data


class TurnSerializer(serializers.Serializer):
    session = SessionSerializer()
    user_message = MessageSerializer()
    assistant_message = MessageSerializer()


class MessageListView(APIView):
    """GET the conversation (oldest first); POST a message and get the finished answer."""

    permission_classes = [ChatScope]

    @extend_schema(responses=MessageSerializer(many=True))
    def get(self, request, pk):
        session = selectors.session_get(user=request.user, session_id=pk)
        messages = selectors.session_messages(session=session)
        return Response(
            {"results": MessageSerializer(messages, many=True, context=details(request)).data}
        )

    @extend_schema(request=SendSerializer, responses={201: TurnSerializer})
    def post(self, request, pk):
        selectors.session_get(user=request.user, session_id=pk)
        return _turn(request, SendSerializer, session_id=pk)


def _turn(request, serializer_class, **which) -> Response:
    """Run a turn to its end from the request's validated body (`which`: its session, or the
    message it regenerates or edits); the reply is its session, its question and its answer."""
    message_id = async_to_sync(_run_to_end)(turn_asked(request, serializer_class, **which))
    assistant, user_message = selectors.turn_messages(message_id=message_id)
    body = {
        "session": SessionSerializer(assistant.session).data,
        "user_message": MessageSerializer(user_message).data,
        "assistant_message": MessageSerializer(assistant, context=details(request)).data,
    }
    return Response(body, status=status.HTTP_201_CREATED)


class MessageRegenerateView(APIView):
    """POST to answer the last question of a session again; the finished turn comes back. The
    answer it replaces is kept as an earlier version (`superseded`); the new one names the first
    (`version_of`). Only the session's last answer (409 otherwise, and while it is written)."""

    permission_classes = [ChatScope]

    @extend_schema(request=RegenerateSerializer, responses={201: TurnSerializer})
    def post(self, request, pk):
        selectors.message_get(user=request.user, message_id=pk)  # 404 before anything is counted
        return _turn(request, RegenerateSerializer, regenerate=pk)


class MessageEditView(APIView):
    """POST the new text of the session's last question; it is answered, and the finished turn
    comes back. The question and answer it replaces are kept as an earlier version, as a
    regenerated answer's are. Only the last question (409 otherwise)."""

    permission_classes = [ChatScope]

    @extend_schema(request=SendSerializer, responses={201: TurnSerializer})
    def post(self, request, pk):
        selectors.message_get(user=request.user, message_id=pk)
        return _turn(request, SendSerializer, edit=pk)


async def _run_to_end(asked: TurnRequest) -> int:
    """The answer's message id, once stored; a spend refusal is this API's 429 (the turn is
    stored as failed, as the chat page shows it). The turn is taken in as every turn is
    (chat.turns.aquestion_intake, inside run_turn)."""
    message_id = None
    refused = None
    async for event in run_turn(asked):
        if isinstance(event, SessionEvent):
            message_id = event.message_id
        elif isinstance(event, Error) and event.code in SPEND_REFUSALS:
            refused = SpendRefused(
                message_for_users(event.code, event.message, partial=False),
                code=event.code,
                retry_after=None if event.retry_after is None else int(event.retry_after),
            )
    if refused is not None:
        raise refused
    return message_id  # type: ignore[return-value]  # set, or the stream raised
