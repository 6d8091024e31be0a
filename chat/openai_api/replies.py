"""What a /v1 handler answers: a Reply, and every failure in OpenAI's error shape, in one place
(a refused request, a pipeline error, an exception)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from chat.openai_api.ratelimit import ratelimit_headers
from chat.turn_record import overhead_ms
from chat.turns import areads_route_details
from core.errors import openai_error_body, unavailable
from routing import events

logger = logging.getLogger(__name__)

OVERHEAD_HEADER = "X-Gateway-Overhead-Ms"

# Pipeline error codes → HTTP status for a request that failed before any token.
_PIPELINE_STATUS = {
    "empty": 400,
    "too_long": 400,
    "unknown_model": 404,
    "model_not_allowed": 403,
    "no_route": 503,
    "no_target": 503,
    "client_error": 502,
    "rate_limited": 503,
    # No room at an endpoint's capacity within the request's deadline (inference_ops.admission).
    "busy": 429,
    # Spend limits (spend.ledger): OpenAI's 429s, rate and quota.
    "limit_exceeded": 429,
    "budget_exceeded": 429,
    "limits_unavailable": 503,
    # The request as sent: a field no target of the rule takes, or the engine refused it.
    "unsupported_parameter": 400,
    "request_refused": 400,
    # A content policy refused it: the provider's reason, in OpenAI's shape.
    "content_filter": 400,
    # The model named serves another API (embeddings only, or no embeddings).
    "unsupported_api": 400,
    # Personal data that no target which may receive it can take (routing.plan.target_refusal).
    "personal_data": 400,
    # A suspected prompt injection, where the privacy settings refuse them (routing.pipeline).
    "prompt_injection": 400,
}
# Pipeline codes → the codes OpenAI's clients know.
_OPENAI_CODES = {
    "too_long": "context_length_exceeded",
    "unknown_model": "model_not_found",
    "limit_exceeded": "rate_limit_exceeded",
    "busy": "rate_limit_exceeded",
    "budget_exceeded": "insufficient_quota",
}


@dataclass
class Reply:
    status: int
    body: dict | None = None  # JSON
    headers: dict[str, str] = field(default_factory=dict)
    stream: AsyncGenerator[str | bytes, None] | None = None  # server-sent events, instead of a body


def error_reply(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: dict | None = None,
) -> Reply:
    return Reply(
        status, openai_error_body(status, message, code=code, param=param), dict(headers or {})
    )


def failure_reply(exc: Exception, *, method: str, path: str) -> Reply:
    """An exception no handler expected, as the client sees it (the log gets the traceback)."""
    # The database or Redis down: the client may retry, nothing is wrong with it.
    outage = unavailable(exc)
    if outage is not None:
        logger.warning("%s %s: %s (%s: %s)", method, path, outage, type(exc).__name__, exc)
        return error_reply(
            503, str(outage), code=outage.code, headers={"Retry-After": str(outage.retry_after)}
        )
    logger.exception("%s %s failed", method, path)
    return error_reply(500, "The server failed to answer this request.", code="internal_error")


async def error_message_for(event: events.Error, user) -> str:
    """The error's message as this caller may read it: an engine failure's details are for the
    staff who may read the routing rules (asked only on an error, never on an answer's way)."""
    if await areads_route_details(user):
        return event.message
    return events.message_for_users(event.code, event.message, partial=event.partial)


def stream_error_event(error: dict) -> str:
    """A stream's last events when it fails: the headers are out, a status can no longer say it."""
    return f"data: {json.dumps({'error': error}, ensure_ascii=False)}\n\ndata: [DONE]\n\n"


async def pipeline_error_event(event: events.Error, user) -> str:
    """A pipeline error that ends a stream, in OpenAI's error shape."""
    message = await error_message_for(event, user)
    return stream_error_event(
        {"message": message, "type": "api_error", "param": None, "code": event.code}
    )


async def pipeline_error_reply(event: events.Error, user) -> Reply:
    status = _PIPELINE_STATUS.get(event.code, 503 if event.retryable else 502)
    code = _OPENAI_CODES.get(event.code, event.code)
    param = event.param or {
        "too_long": "messages",
        "unknown_model": "model",
        "model_not_allowed": "model",
        "empty": "messages",
    }.get(event.code)
    headers = route_headers(None, event)
    if event.retry_after is not None:  # an engine asked to be left alone: say when to come back
        headers["Retry-After"] = str(max(1, math.ceil(event.retry_after)))
    message = await error_message_for(event, user)
    return error_reply(status, message, code=code, param=param, headers=headers)


def route_headers(route: events.Route | None, error: events.Error | None = None) -> dict:
    """The road taken, and the caller's limits after this request as OpenAI's
    x-ratelimit-* headers (when any apply)."""
    source = route or error
    headers = {
        "X-Route": (source.road if source else "") or "",
        "X-Route-Rule": (source.rule if source else "") or "",
        "X-Route-Target": (source.target if source else "") or "",
    }
    if source is not None and source.standing is not None:
        headers.update(ratelimit_headers(source.standing))
    return headers


def overhead_header(arrived: float, engine_ms: float | None) -> str:
    """OVERHEAD_HEADER's value: the gateway's milliseconds since the request arrived."""
    return f"{overhead_ms(arrived, engine_ms):.1f}"
