"""The endpoints: `models`, `chat_completions` and `completion_update` (a verdict on an answer),
each from the request's headers (and body) to a Reply. The key is checked first; a chat completion
is one chat turn (chat.turns.run_turn)."""

from __future__ import annotations

import json
import time
import uuid

from chat.apikeys import apikey_authenticate_cached
from chat.exceptions import ChatError, MessageTooLarge, RateLimited, SessionNotFound
from chat.feedback import completion_id as completion_id_of
from chat.feedback import completion_key, feedback_give
from chat.models import ApiKey, ChatSession
from chat.openai_api.completion import completion_body, completion_stream
from chat.openai_api.replies import (
    OVERHEAD_HEADER,
    Reply,
    error_reply,
    overhead_header,
    pipeline_error_reply,
    route_headers,
)
from chat.openai_api.schema import completion_request, session_named
from chat.turn_request import TurnRequest
from chat.turns import SessionEvent, run_turn
from core import db
from knowledge.exceptions import EntryInvalid
from observability.models import RequestLog
from routing import events
from routing.embeddings import kb_model_name
from routing.rules import asnapshot


async def authenticate(headers: dict[str, str]) -> ApiKey | Reply:
    scheme, _, raw = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        return error_reply(
            401, "Missing API key: send `Authorization: Bearer gw_…`.", code="invalid_api_key"
        )
    key = await apikey_authenticate_cached(raw=raw.strip())
    if key is None:
        return error_reply(401, "Incorrect or revoked API key.", code="invalid_api_key")
    if ApiKey.Scope.CHAT not in key.scopes:
        return error_reply(403, "This API key lacks the `chat` scope.", code="insufficient_scope")
    return key


async def models(headers: dict[str, str]) -> Reply:
    key = await authenticate(headers)
    if isinstance(key, Reply):
        return key
    snap = await asnapshot()
    created = int(time.time())
    kb_model = await kb_model_name()
    # Each model says which APIs it answers (`apis`, beside OpenAI's fields): `auto` routes chat
    # and completions by the rules, and embeds with the knowledge base's model.
    data = [
        {
            "id": "auto",
            "object": "model",
            "created": created,
            "owned_by": "gateway",
            "apis": ["chat", "completions"] + (["embeddings"] if kb_model else []),
        }
    ]
    # Only what a rule lets this key name (the rule that takes a question still decides).
    data += [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": snap.targets_by_model[name].road,
            "apis": sorted(snap.targets_by_model[name].apis),
        }
        for name in snap.nameable(groups=key.group_names, client=key.client)
    ]
    if kb_model:
        data.append(
            {
                "id": kb_model,
                "object": "model",
                "created": created,
                "owned_by": "gateway",
                "apis": ["embeddings"],
            }
        )
    return Reply(200, {"object": "list", "data": data})


async def chat_completions(headers: dict[str, str], raw_body: bytes, arrived: float) -> Reply:
    key = await authenticate(headers)
    if isinstance(key, Reply):
        return key
    parsed = completion_request(raw_body)
    if isinstance(parsed, Reply):
        return parsed
    session_id = session_named(headers)
    if isinstance(session_id, Reply):
        return session_id
    if parsed.model != "auto" and parsed.model not in (await asnapshot()).targets_by_model:
        return error_reply(
            404,
            f"The model `{parsed.model}` does not exist; see /v1/models.",
            code="model_not_found",
            param="model",
        )
    # Stored as a chat turn only in a session the client names; the request log keeps every call.
    request_key = uuid.uuid4()
    asked = TurnRequest(
        user=key.user,
        content=parsed.text,
        interface=RequestLog.Interface.V1,
        client=key.client,
        priority=key.priority or None,
        source=ChatSession.Source.API,
        model=parsed.model,
        max_tokens=parsed.max_tokens,
        temperature=parsed.temperature,
        system=parsed.system,
        passthrough=parsed.passthrough,
        history=parsed.history,
        groups=key.group_names,
        api_key_id=key.pk,
        session_id=session_id,
        store=session_id is not None,
    )
    turn = run_turn(asked, arrived=arrived, request_key=request_key)
    # The id names the answer for a verdict later (completion_update).
    completion_id = completion_id_of(request_key, key.user_id)
    created = int(time.time())
    # Read up to the route (or an error) first: the route headers go out before the body. The
    # turn validates and counts the question before it stores anything.
    route = None
    try:
        async for event in turn:
            if isinstance(event, SessionEvent):
                continue
            if isinstance(event, events.Error):
                await turn.aclose()
                return await pipeline_error_reply(event, key.user)
            route = event
            break
    except RateLimited as exc:  # too many questions, or too many answers at once (TooManyStreams)
        code = "rate_limit_exceeded" if exc.code == RateLimited.code else exc.code
        return error_reply(429, str(exc), code=code, headers={"Retry-After": str(exc.retry_after)})
    except MessageTooLarge as exc:
        return error_reply(413, str(exc), code="message_too_large", param="messages")
    except SessionNotFound as exc:
        return error_reply(404, str(exc), code="session_not_found", param="X-Session-Id")
    except ChatError as exc:
        return error_reply(exc.status, str(exc), code=exc.code, param="messages")
    # The model that answers: the one named, or the fallback that answered in its place.
    model_name = (
        f"auto:{route.target or route.road}"  # type: ignore[union-attr]  # the loop stops at the route
        if parsed.model == "auto"
        else route.target or parsed.model  # type: ignore[union-attr]  # the loop stops at the route
    )
    choices = parsed.passthrough.choices
    if parsed.stream:
        reply = Reply(
            200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                # So far: the stream's last chunk says it for the whole answer.
                OVERHEAD_HEADER: overhead_header(arrived, route.engine_ms),  # type: ignore[union-attr]  # the loop stops at the route
            },
            stream=completion_stream(
                turn=turn,
                completion_id=completion_id,
                created=created,
                model=model_name,
                include_usage=parsed.include_usage,
                user=key.user,
                choices=choices,
            ),
        )
    else:
        reply = await completion_body(
            turn=turn,
            completion_id=completion_id,
            created=created,
            model=model_name,
            user=key.user,
            choices=choices,
        )
    # Under the reply's own: an answer continued elsewhere names the endpoint that finished it.
    reply.headers = {**route_headers(route), **reply.headers}  # type: ignore[arg-type]  # the loop stops at the route
    return reply


async def completion_update(
    headers: dict[str, str], raw_body: bytes, arrived: float, completion_id: str
) -> Reply:
    """`POST /v1/chat/completions/{id}`, OpenAI's call that updates a stored completion's
    `metadata` (the SDK's `client.chat.completions.update(id, metadata=…)`): here the metadata
    `feedback` (`up`, `down`, or empty to take it back) and `comment` are the user's verdict on
    that answer."""
    key = await authenticate(headers)
    if isinstance(key, Reply):
        return key
    request_key = completion_key(completion_id, key.user_id)
    if request_key is None:
        return error_reply(
            404,
            f"No chat completion {completion_id!r} for this key's user.",
            code="not_found",
        )
    try:
        body = json.loads(raw_body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return error_reply(400, "The body is not JSON.", code="invalid_json")
    metadata = body.get("metadata") if isinstance(body, dict) else None
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        return error_reply(
            400,
            'Send {"metadata": {"feedback": "up" | "down" | "", "comment": "…"}}: '
            "metadata is an object of strings.",
            code="invalid_request_error",
            param="metadata",
        )
    if "feedback" not in metadata:
        return error_reply(
            400,
            "metadata.feedback is required: `up`, `down`, or empty to take a verdict back.",
            code="invalid_request_error",
            param="metadata.feedback",
        )
    try:
        await db.run(
            feedback_give,
            user=key.user,
            request_key=request_key,
            verdict=metadata["feedback"],
            comment=metadata.get("comment", ""),
            interface=RequestLog.Interface.V1,
        )
    except EntryInvalid as exc:
        field, message = next(iter(exc.errors.items()))
        return error_reply(
            400,
            f"metadata.{field if field != 'verdict' else 'feedback'} {message}.",
            code="invalid_request_error",
            param=f"metadata.{'feedback' if field == 'verdict' else field}",
        )
    return Reply(
        200,
        {
            "id": completion_id,
            "object": "chat.completion",
            "metadata": {
                "feedback": metadata["feedback"],
                "comment": metadata.get("comment", ""),
            },
        },
    )
