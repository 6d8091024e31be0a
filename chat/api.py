"""DRF API for integrations (browser session or API key with the `chat` scope):
sessions, their messages, sending a message (JSON or SSE), regenerating the last answer or
editing the last question, searching one's messages, and the user's API keys."""

from __future__ import annotations

import json
import logging

from asgiref.sync import async_to_sync
from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from chat import apikeys, selectors, services
from chat.auth import ChatScope, SessionOnly
from chat.exceptions import SPEND_REFUSALS, ChatError, SpendRefused
from chat.feedback import message_feedback
from chat.models import ApiKey, ChatSession, Message
from chat.turns import SessionEvent, TurnRequest, question_intake, reads_route_details, run_turn
from chat.usage import usage_read
from core.errors import unavailable
from core.fields import TextField
from observability.models import RequestLog
from routing.events import Error, message_for_users

logger = logging.getLogger(__name__)


class SessionSerializer(serializers.ModelSerializer):
    title = TextField(max_length=200, required=False, allow_blank=True)

    class Meta:
        model = ChatSession
        fields = ["id", "title", "source", "created_at", "updated_at"]
        read_only_fields = ["id", "source", "created_at", "updated_at"]


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


class SendSerializer(serializers.Serializer):
    content = TextField(trim_whitespace=False, allow_blank=True)
    max_tokens = serializers.IntegerField(min_value=1, max_value=32768, required=False)
    temperature = serializers.FloatField(min_value=0, max_value=2, required=False)


class RegenerateSerializer(serializers.Serializer):
    max_tokens = serializers.IntegerField(min_value=1, max_value=32768, required=False)
    temperature = serializers.FloatField(min_value=0, max_value=2, required=False)


class FeedbackSerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(
        choices=["up", "down", ""],
        help_text="`up` (right), `down` (wrong) or empty to take a verdict back.",
    )
    comment = TextField(required=False, allow_blank=True, default="", max_length=2000)


class FeedbackReplySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    verdict = serializers.CharField()
    note = serializers.CharField(
        help_text="Empty, or what to tell the user of their verdict: a 👎 past their daily "
        "allowance of answers sent for review is kept but sent to no reviewer."
    )


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


def _client(request) -> str:
    return request.auth.client if isinstance(request.auth, ApiKey) else "web"


def _details(request) -> dict:
    """The serializer context of a caller: whether it may read a failure's details."""
    return {"details": reads_route_details(request.user)}


def _logged_as(request) -> dict:
    """How the request log names this request's origin; and its API key's priority class at a
    full endpoint, when staff gave it one."""
    key = request.auth if isinstance(request.auth, ApiKey) else None
    return {
        "interface": RequestLog.Interface.API,
        "api_key_id": key.pk if key is not None else None,
        "priority": (key.priority or None) if key is not None else None,
    }


class SessionListView(APIView):
    permission_classes = [ChatScope]

    @extend_schema(responses=SessionSerializer(many=True))
    def get(self, request):
        sessions = ChatSession.objects.filter(user=request.user).order_by("-updated_at", "-pk")
        paginator = Pagination()
        page = paginator.paginate_queryset(sessions, request, view=self)
        return paginator.get_paginated_response(SessionSerializer(page, many=True).data)

    @extend_schema(request=SessionSerializer, responses={201: SessionSerializer})
    def post(self, request):
        data = SessionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        session = services.session_create(
            user=request.user, title=data.validated_data.get("title", "")
        )
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED)


class SessionDetailView(APIView):
    permission_classes = [ChatScope]

    @extend_schema(responses=SessionSerializer)
    def get(self, request, pk):
        return Response(
            SessionSerializer(services.session_get(user=request.user, session_id=pk)).data
        )

    @extend_schema(request=SessionSerializer, responses=SessionSerializer)
    def patch(self, request, pk):
        session = services.session_get(user=request.user, session_id=pk)
        data = SessionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        session = services.session_rename(
            session=session, title=data.validated_data.get("title", "")
        )
        return Response(SessionSerializer(session).data)

    @extend_schema(responses={204: None})
    def delete(self, request, pk):
        services.session_delete(session=services.session_get(user=request.user, session_id=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class TurnSerializer(serializers.Serializer):
    session = SessionSerializer()
    user_message = MessageSerializer()
    assistant_message = MessageSerializer()


class MessageListView(APIView):
    """GET the conversation (oldest first); POST a message and get the finished answer."""

    permission_classes = [ChatScope]

    @extend_schema(responses=MessageSerializer(many=True))
    def get(self, request, pk):
        session = services.session_get(user=request.user, session_id=pk)
        messages = session.messages.order_by("created_at", "pk")[:1000]
        return Response(
            {"results": MessageSerializer(messages, many=True, context=_details(request)).data}
        )

    @extend_schema(request=SendSerializer, responses={201: TurnSerializer})
    def post(self, request, pk):
        services.session_get(user=request.user, session_id=pk)
        return _turn(request, SendSerializer, session_id=pk)


def _turn(request, serializer_class, **which) -> Response:
    """Run a turn to its end from the request's validated body (`which`: its session, or the
    message it regenerates or edits); the reply is its session, its question and its answer."""
    data = serializer_class(data=request.data)
    data.is_valid(raise_exception=True)
    message_id = async_to_sync(_run_to_end)(request, data.validated_data, **which)
    assistant = Message.objects.select_related("session").get(pk=message_id)
    user_message = (
        assistant.session.messages.filter(role="user", pk__lt=assistant.pk).order_by("pk").last()
    )
    body = {
        "session": SessionSerializer(assistant.session).data,
        "user_message": MessageSerializer(user_message).data,
        "assistant_message": MessageSerializer(assistant, context=_details(request)).data,
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


class SearchHitSerializer(serializers.Serializer):
    message_id = serializers.IntegerField()
    session_id = serializers.IntegerField()
    session_title = serializers.CharField()
    role = serializers.CharField()
    snippet = serializers.CharField(help_text="Plain text around the first match.")
    created_at = serializers.DateTimeField()


class SearchPagination(Pagination):
    page_size = 20
    max_page_size = 100


class SearchView(APIView):
    """GET `?q=…`: your own messages that contain every word of `q` (Chinese, Japanese and Korean
    text matched by its characters), best match first, with the session to open at each. An empty
    query, or one over 200 characters, is a 400."""

    permission_classes = [ChatScope]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "q", str, required=True, description="Words to find (1 to 200 chars)."
            ),
            OpenApiParameter("page", int, description="A page of 20 hits, from 1."),
            OpenApiParameter("page_size", int, description="Hits per page, at most 100."),
        ],
        responses=SearchHitSerializer(many=True),
    )
    def get(self, request):
        query = selectors.search_query_validate(request.query_params.get("q", ""))
        hits = selectors.messages_search(user=request.user, query=query)
        paginator = SearchPagination()
        page = paginator.paginate_queryset(hits, request, view=self)
        results = [
            {
                "message_id": hit.message_id,
                "session_id": hit.session_id,
                "session_title": hit.session_title,
                "role": hit.role,
                "snippet": selectors.search_snippet(hit.content, query),
                "created_at": hit.created_at,
            }
            for hit in page
        ]
        return paginator.get_paginated_response(SearchHitSerializer(results, many=True).data)


class MessageFeedbackView(APIView):
    """POST a verdict on one of your answers: 👍 `up` or 👎 `down` (and a comment). A 👎 on a
    direct answer from the knowledge base puts it in the curators' review queue."""

    permission_classes = [ChatScope]

    @extend_schema(request=FeedbackSerializer, responses=FeedbackReplySerializer)
    def post(self, request, pk):
        data = FeedbackSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        message, note = message_feedback(
            user=request.user,
            message_id=pk,
            verdict=data.validated_data["verdict"],
            comment=data.validated_data["comment"],
            # The chat page posts with the browser's session; integrations with a key.
            interface=RequestLog.Interface.API
            if isinstance(request.auth, ApiKey)
            else RequestLog.Interface.WEB,
        )
        return Response({"id": message.pk, "verdict": message.verdict, "note": note})


async def _run_to_end(request, data, **turn) -> int:
    """The answer's message id, once stored; a spend refusal is this API's 429 (the turn is
    stored as failed, as the chat page shows it). `turn`: the session (`session_id`), or the
    message to answer again (`regenerate`, `edit`), as run_turn takes them."""
    message_id = None
    refused = None
    async for event in run_turn(
        TurnRequest(
            user=request.user,
            content=data.get("content"),
            client=_client(request),
            **turn,
            max_tokens=data.get("max_tokens"),
            temperature=data.get("temperature"),
            **_logged_as(request),
        )
    ):
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
    return message_id


_STREAM_RESPONSES = {
    (200, "text/event-stream"): OpenApiResponse(
        description=(
            "`event: session`, `route`, `token`…, then `done` or `error`; each `data:` is JSON."
        )
    )
}


class MessageStreamView(APIView):
    """POST a message; the answer streams back as server-sent events
    (`event: route|token|done|error`). A route's `why` and an engine failure's message are plain
    ones unless the caller may read the routing rules (chat.turns.reads_route_details)."""

    permission_classes = [ChatScope]

    @extend_schema(request=SendSerializer, responses=_STREAM_RESPONSES)
    def post(self, request, pk):
        services.session_get(user=request.user, session_id=pk)
        return _turn_stream(request, SendSerializer, session_id=pk)


def _turn_stream(request, serializer_class, *, session_id=None, regenerate=None, edit=None):
    """A turn streamed as server-sent events. Everything that can refuse it (bad input, the rate
    limit, a stream slot, for a new version the exchange it replaces) is checked before the
    headers go out, so a refusal is a plain 4xx, not an event."""
    data = serializer_class(data=request.data)
    data.is_valid(raise_exception=True)
    asked = TurnRequest(
        user=request.user,
        content=data.validated_data.get("content"),
        session_id=session_id,
        client=_client(request),
        max_tokens=data.validated_data.get("max_tokens"),
        temperature=data.validated_data.get("temperature"),
        regenerate=regenerate,
        edit=edit,
        **_logged_as(request),
    )
    # The turn gives the slot back; a stream never started (the client gone before its first
    # byte) leaves it to its lease.
    turn = run_turn(asked, admitted=question_intake(asked, start_redo=True))
    response = StreamingHttpResponse(
        _sse(turn, details=reads_route_details(request.user)), content_type="text/event-stream"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


class MessageRegenerateStreamView(APIView):
    """POST to answer the session's last question again, streamed as server-sent events as a new
    message's answer is (`…/messages/stream`). Refused as `…/regenerate` refuses, before the
    stream starts."""

    permission_classes = [ChatScope]

    @extend_schema(request=RegenerateSerializer, responses=_STREAM_RESPONSES)
    def post(self, request, pk):
        selectors.message_get(user=request.user, message_id=pk)
        return _turn_stream(request, RegenerateSerializer, regenerate=pk)


class MessageEditStreamView(APIView):
    """POST the new text of the session's last question; its answer streams back as server-sent
    events. Refused as `…/edit` refuses, before the stream starts."""

    permission_classes = [ChatScope]

    @extend_schema(request=SendSerializer, responses=_STREAM_RESPONSES)
    def post(self, request, pk):
        selectors.message_get(user=request.user, message_id=pk)
        return _turn_stream(request, SendSerializer, edit=pk)


async def _sse(turn, *, details: bool):
    try:
        async for event in turn:
            data = json.dumps(event.as_dict(details=details), ensure_ascii=False)
            yield f"event: {event.type}\ndata: {data}\n\n"
    except ChatError as exc:
        yield f"event: error\ndata: {json.dumps({'code': exc.code, 'message': str(exc)})}\n\n"
    except Exception as exc:
        # The headers are out: an outage of the database or Redis is the stream's last event.
        if (outage := unavailable(exc)) is None:
            raise
        logger.warning("chat stream failed: %s (%s: %s)", outage, type(exc).__name__, exc)
        body = {"code": outage.code, "message": str(outage), "retry_after": outage.retry_after}
        yield f"event: error\ndata: {json.dumps(body)}\n\n"
    finally:
        await turn.aclose()


class UsageLimitSerializer(serializers.Serializer):
    whose = serializers.CharField(help_text='"API key NAME", "user NAME" or "group NAME"')
    kind = serializers.ChoiceField(choices=["key", "user", "group"])
    limit = serializers.CharField(help_text='e.g. "tokens per minute", "budget per month"')
    unit = serializers.CharField(help_text="requests, tokens, or the budget's currency")
    allowed = serializers.FloatField()
    used = serializers.FloatField(help_text="in the current window, reservations included")
    remaining = serializers.FloatField()
    resets_in_seconds = serializers.IntegerField()
    over_budget = serializers.ChoiceField(
        choices=["refuse", "reroute"], allow_null=True, help_text="budgets only"
    )


class UsageSpendSerializer(serializers.Serializer):
    currency = serializers.CharField()
    whose = serializers.CharField(help_text='"this API key" or "you"')
    today = serializers.FloatField()
    this_month = serializers.FloatField()


class UsagePrioritySerializer(serializers.Serializer):
    deadline_seconds = serializers.FloatField(
        help_text="how long a request waits at most at a full endpoint before a 429"
    )


# "class" and "from" are Python keywords: declared after the class statement.
UsagePrioritySerializer._declared_fields.update(
    {
        "class": serializers.CharField(help_text="interactive, api or batch"),
        "from": serializers.CharField(help_text="this API key, your groups, or a default"),
    }
)


class UsageSerializer(serializers.Serializer):
    limits = UsageLimitSerializer(many=True)
    spend = UsageSpendSerializer()
    priority = UsagePrioritySerializer(
        help_text="Your requests' priority class when an endpoint is at its capacity."
    )


class UsageView(APIView):
    """GET your limits, what is left of each in its window, and what you spent today and this
    month (with an API key: that key's spend). The limits are your key's, your own and your
    groups' (spend limits, set by the operators). Also your priority class when an endpoint is
    at its capacity, and how long your requests wait there at most."""

    permission_classes = [ChatScope]

    @extend_schema(responses=UsageSerializer)
    def get(self, request):
        api_key_id = request.auth.pk if isinstance(request.auth, ApiKey) else None
        usage = usage_read(user=request.user, api_key_id=api_key_id)
        return Response({"limits": usage.limits, "spend": usage.spend, "priority": usage.priority})


# --- API keys -------------------------------------------------------------------------------------


class ApiKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "scopes", "created_at", "last_used_at", "revoked_at"]


class ApiKeyCreateSerializer(serializers.Serializer):
    name = TextField(max_length=100)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ApiKey.Scope.values), default=["chat"]
    )


class ApiKeyListView(APIView):
    permission_classes = [SessionOnly]

    @extend_schema(responses=ApiKeySerializer(many=True))
    def get(self, request):
        keys = ApiKey.objects.filter(user=request.user).order_by("-created_at")
        return Response({"results": ApiKeySerializer(keys, many=True).data})

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: ApiKeySerializer})
    def post(self, request):
        data = ApiKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key, raw = apikeys.apikey_create(user=request.user, **data.validated_data)
        return Response({**ApiKeySerializer(key).data, "key": raw}, status=status.HTTP_201_CREATED)


class ApiKeyDetailView(APIView):
    permission_classes = [SessionOnly]

    @extend_schema(responses={204: None})
    def delete(self, request, pk):
        key = ApiKey.objects.filter(pk=pk, user=request.user).first()
        if key is None:
            raise NotFound(
                f"No API key {pk}."
            )  # the error shape comes from core.errors, as everywhere
        apikeys.apikey_revoke(key=key)
        return Response(status=status.HTTP_204_NO_CONTENT)
