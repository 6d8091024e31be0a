"""The chat API's streamed turns: a new question, the last answer regenerated or the last question
edited, the answer coming back as server-sent events. Every refusal comes before the headers."""

from __future__ import annotations

import json
import logging

from asgiref.sync import async_to_sync
from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.views import APIView

from chat import selectors
from chat.api.turn_input import RegenerateSerializer, SendSerializer, turn_asked
from chat.auth import ChatScope
from chat.exceptions import ChatError
from chat.turns import aquestion_intake, reads_route_details, run_turn
from core.errors import unavailable

logger = logging.getLogger(__name__)

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
        selectors.session_get(user=request.user, session_id=pk)
        return _turn_stream(request, SendSerializer, session_id=pk)


def _turn_stream(request, serializer_class, **which):
    """A turn streamed as server-sent events. Everything that can refuse it (bad input, the rate
    limit, a stream slot, for a new version the exchange it replaces) is checked before the
    headers go out, so a refusal is a plain 4xx, not an event: the turn's own intake
    (chat.turns.aquestion_intake), run here rather than inside run_turn."""
    asked = turn_asked(request, serializer_class, **which)
    # The turn gives the slot back; a stream never started (the client gone before its first
    # byte) leaves it to its lease.
    turn = run_turn(asked, admitted=async_to_sync(aquestion_intake)(asked))
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
