"""What a turn takes from a chat API request, for the messages and their streams alike: the
bodies' serializers, and the TurnRequest built from the caller, its key and its body."""

from __future__ import annotations

from rest_framework import serializers

from chat.models import ApiKey
from chat.turn_request import TurnRequest
from chat.turns import reads_route_details
from core.fields import TextField
from observability.models import RequestLog


class SendSerializer(serializers.Serializer):
    content = TextField(trim_whitespace=False, allow_blank=True)
    max_tokens = serializers.IntegerField(min_value=1, max_value=32768, required=False)
    temperature = serializers.FloatField(min_value=0, max_value=2, required=False)


class RegenerateSerializer(serializers.Serializer):
    max_tokens = serializers.IntegerField(min_value=1, max_value=32768, required=False)
    temperature = serializers.FloatField(min_value=0, max_value=2, required=False)


def _client(request) -> str:
    return request.auth.client if isinstance(request.auth, ApiKey) else "web"


def details(request) -> dict:
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


def turn_asked(request, serializer_class, **which) -> TurnRequest:
    """The turn a request asks for, its body validated by `serializer_class` (a 400 when it is
    bad). `which`: its session (`session_id`), or the message it answers again (`regenerate`) or
    edits (`edit`), as run_turn takes them."""
    data = serializer_class(data=request.data)
    data.is_valid(raise_exception=True)
    body = data.validated_data
    return TurnRequest(
        user=request.user,
        content=body.get("content"),
        client=_client(request),
        **which,
        max_tokens=body.get("max_tokens"),
        temperature=body.get("temperature"),
        **_logged_as(request),
    )
