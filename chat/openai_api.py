"""An OpenAI-compatible API: `GET /v1/models` and `POST /v1/chat/completions`.

The official `openai` SDK works unchanged with `base_url=…/v1` and an API key with the
`chat` scope. `model: "auto"` routes by the rules (KB answers included); a model name
from /v1/models asks for that target, where the rule that takes the question lists it.
Every response carries X-Route, X-Route-Rule and X-Route-Target. Errors have OpenAI's shape:
{"error": {"message", "type", "param", "code"}}; an engine failure's message is a plain one unless
the key's user may read the routing rules (chat.turns.reads_route_details).

It is a bare ASGI application (config.asgi sends `/v1/` here), not a Django view: every
request of this API is async end to end on the event loop. Django's handler would add a
request thread for its middleware, signals sent under a lock, and a streaming response that
writes chunk by chunk through several layers; for a relay whose cost multiplies by the number
of concurrent streams, that was most of the gateway's time per request. What the middleware
gave this API is done here: the Host check, the body size limit (refused before it is read),
and the security headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Literal

import orjson
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from chat import metrics, services
from chat.exceptions import ChatError, MessageTooLarge, RateLimited, SessionNotFound
from chat.models import ApiKey, ChatSession, RequestLog
from chat.turns import SessionEvent, areads_route_details, overhead_ms, run_turn
from core import db
from core.errors import openai_error_body, unavailable
from core.text import text_problem
from routing import pipeline
from routing.rules import asnapshot

logger = logging.getLogger(__name__)

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
}


@dataclass
class Reply:
    status: int
    body: dict | None = None  # JSON
    headers: dict[str, str] = field(default_factory=dict)
    stream: AsyncIterator[str | bytes] | None = None  # server-sent events, instead of a body


def _error(
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


async def _authenticate(headers: dict[str, str]) -> ApiKey | Reply:
    scheme, _, raw = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        return _error(
            401, "Missing API key: send `Authorization: Bearer gw_…`.", code="invalid_api_key"
        )
    key = await services.aapikey_authenticate(raw.strip())
    if key is None:
        return _error(401, "Incorrect or revoked API key.", code="invalid_api_key")
    if ApiKey.Scope.CHAT not in key.scopes:
        return _error(403, "This API key lacks the `chat` scope.", code="insufficient_scope")
    return key


async def models(headers: dict[str, str]) -> Reply:
    key = await _authenticate(headers)
    if isinstance(key, Reply):
        return key
    snap = await asnapshot()
    created = int(time.time())
    data = [{"id": "auto", "object": "model", "created": created, "owned_by": "gateway"}]
    # Only what a rule lets this key name (the rule that takes a question still decides).
    data += [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": snap.targets_by_model[name].road,
        }
        for name in snap.nameable(groups=key.group_names, client=key.client)
    ]
    return Reply(200, {"object": "list", "data": data})


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: StrictStr
    text: StrictStr | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[_Part]

    @property
    def text(self) -> str | None:
        """A string, or the text parts of a list joined; None when there is no text at all."""
        if isinstance(self.content, str):
            return self.content
        texts = [part.text for part in self.content if part.type == "text"]
        return "\n".join(texts) if texts and all(isinstance(t, str) for t in texts) else None


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


_Tokens = Annotated[StrictInt, Field(ge=1, le=32768)]


class _Body(BaseModel):
    """What this API reads of a chat completion request; the rest of OpenAI's fields are allowed
    and ignored. Strict types: `"5"` is no number and `true` no token count."""

    model_config = ConfigDict(extra="allow")
    model: Annotated[StrictStr, Field(min_length=1)]
    messages: Annotated[list[_Message], Field(min_length=1)]
    max_tokens: _Tokens | None = None
    max_completion_tokens: _Tokens | None = None
    temperature: Annotated[float, Field(ge=0, le=2, strict=True)] | None = None
    # vLLM's extension (llama.cpp's server takes it too): generate to max_tokens whatever the model
    # says. Passed on to local engines only; benchmarks use it for answers of a known length.
    ignore_eos: StrictBool = False
    n: Literal[1] | None = None
    stream: StrictBool = False
    stream_options: _StreamOptions | None = None


# The 400's message for a field the schema refused, by field: one wording per field, whatever the
# reason (type, range, missing), naming what is accepted.
_REFUSED = {
    "model": '`model` is required: "auto" or a name from /v1/models.',
    "messages": "`messages` must be a non-empty list.",
    "max_tokens": "`max_tokens` must be a number from 1 to 32768.",
    "max_completion_tokens": "`max_completion_tokens` must be a number from 1 to 32768.",
    "temperature": "`temperature` must be a number from 0 to 2.",
    "ignore_eos": "`ignore_eos` must be a boolean.",
    "n": "Only n=1 is supported.",
    "stream": "`stream` must be a boolean.",
    "stream_options": "`stream_options` must be an object.",
}


def _message_refused(index: int) -> Reply:
    return _error(
        400,
        f"messages[{index}] needs a role (system, user, assistant) and text content.",
        param=f"messages[{index}]",
    )


def _schema_refused(exc: ValidationError) -> Reply:
    loc = exc.errors(include_url=False)[0]["loc"]
    if not loc:
        return _error(400, "The request body must be a JSON object.")
    if loc[0] == "messages" and len(loc) > 1 and isinstance(loc[1], int):
        return _message_refused(loc[1])
    return _error(400, _REFUSED[loc[0]], param=str(loc[0]))


def _parse(body) -> dict | Reply:
    try:
        request = _Body.model_validate(body)
    except ValidationError as exc:
        return _schema_refused(exc)
    history, system = [], []
    for index, message in enumerate(request.messages):
        text = message.text
        if text is None:
            return _message_refused(index)
        # Every message, not only the question: all of them go to the engine, and none may cost a
        # rate-limit slot by failing later.
        if (problem := text_problem(text)) is not None:
            return _error(
                400,
                f"messages[{index}] {problem}.",
                code="invalid_text",
                param=f"messages[{index}]",
            )
        if message.role in ("system", "developer"):
            system.append(text)
        else:
            history.append({"role": message.role, "content": text})
    if not history or history[-1]["role"] != "user":
        return _error(400, "The last message must come from the user.", param="messages")
    options = {
        "max_tokens": request.max_completion_tokens or request.max_tokens,
        "temperature": request.temperature,
    }
    return {
        "model": request.model,
        "question": history[-1]["content"],
        "history": history[:-1],
        "system": "\n\n".join(system),
        "stream": request.stream,
        "include_usage": bool(request.stream_options and request.stream_options.include_usage),
        "ignore_eos": request.ignore_eos,
        **{name: value for name, value in options.items() if value is not None},
    }


def _route_headers(route: pipeline.Route | None, error: pipeline.Error | None = None) -> dict:
    source = route or error
    return {
        "X-Route": (source.road if source else "") or "",
        "X-Route-Rule": (source.rule if source else "") or "",
        "X-Route-Target": (source.target if source else "") or "",
    }


async def _message_for(event: pipeline.Error, user) -> str:
    """The error's message as this caller may read it: an engine failure's details are for the
    staff who may read the routing rules (asked only on an error, never on an answer's way)."""
    if await areads_route_details(user):
        return event.message
    return pipeline.message_for_users(event.code, event.message, partial=event.partial)


async def _pipeline_error(event: pipeline.Error, user) -> Reply:
    status = _PIPELINE_STATUS.get(event.code, 503 if event.retryable else 502)
    code = {"too_long": "context_length_exceeded", "unknown_model": "model_not_found"}.get(
        event.code, event.code
    )
    param = {
        "too_long": "messages",
        "unknown_model": "model",
        "model_not_allowed": "model",
        "empty": "messages",
    }.get(event.code)
    headers = _route_headers(None, event)
    if event.retry_after is not None:  # an engine asked to be left alone: say when to come back
        headers["Retry-After"] = str(max(1, math.ceil(event.retry_after)))
    return _error(status, await _message_for(event, user), code=code, param=param, headers=headers)


def _session_named(headers: dict[str, str]) -> int | None | Reply:
    """The chat session a call asks to be stored in (`X-Session-Id`), if any."""
    raw = headers.get("x-session-id", "").strip()
    if not raw:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        return _error(
            400,
            "X-Session-Id must be the id of one of your chat sessions.",
            code="invalid_session",
            param="X-Session-Id",
        )
    return int(raw)


async def chat_completions(headers: dict[str, str], raw_body: bytes, arrived: float) -> Reply:
    key = await _authenticate(headers)
    if isinstance(key, Reply):
        return key
    try:
        body = json.loads(raw_body or b"")
    except ValueError as exc:
        return _error(400, f"The body is not valid JSON: {exc}.")
    parsed = _parse(body)
    if isinstance(parsed, Reply):
        return parsed
    session_id = _session_named(headers)
    if isinstance(session_id, Reply):
        return session_id
    if parsed["model"] != "auto" and parsed["model"] not in (await asnapshot()).targets_by_model:
        return _error(
            404,
            f"The model `{parsed['model']}` does not exist; see /v1/models.",
            code="model_not_found",
            param="model",
        )
    # Stored as a chat turn only in a session the client names; the request log keeps every call.
    turn = run_turn(
        user=key.user,
        content=parsed["question"],
        client=key.client,
        source=ChatSession.Source.API,
        model=parsed["model"],
        max_tokens=parsed.get("max_tokens"),
        temperature=parsed.get("temperature"),
        ignore_eos=parsed["ignore_eos"],
        history=parsed["history"],
        groups=key.group_names,
        system=parsed["system"],
        session_id=session_id,
        store=session_id is not None,
        interface=RequestLog.Interface.V1,
        api_key_id=key.pk,
        arrived=arrived,
    )
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    # Read up to the route (or an error) first: the route headers go out before the body. The
    # turn validates and counts the question before it stores anything.
    route = None
    try:
        async for event in turn:
            if isinstance(event, SessionEvent):
                continue
            if isinstance(event, pipeline.Error):
                await turn.aclose()
                return await _pipeline_error(event, key.user)
            route = event
            break
    except RateLimited as exc:  # too many questions, or too many answers at once (TooManyStreams)
        code = "rate_limit_exceeded" if exc.code == RateLimited.code else exc.code
        return _error(429, str(exc), code=code, headers={"Retry-After": str(exc.retry_after)})
    except MessageTooLarge as exc:
        return _error(413, str(exc), code="message_too_large", param="messages")
    except SessionNotFound as exc:
        return _error(404, str(exc), code="session_not_found", param="X-Session-Id")
    except ChatError as exc:
        return _error(exc.status, str(exc), code=exc.code, param="messages")
    model_name = (
        parsed["model"] if parsed["model"] != "auto" else f"auto:{route.target or route.road}"
    )
    if parsed["stream"]:
        reply = Reply(
            200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                # So far: the stream's last chunk says it for the whole answer.
                OVERHEAD_HEADER: _overhead(arrived, route.engine_ms),
            },
            stream=_stream(
                turn, completion_id, created, model_name, parsed["include_usage"], key.user
            ),
        )
    else:
        reply = await _complete(turn, completion_id, created, model_name, key.user)
    reply.headers.update(_route_headers(route))
    return reply


OVERHEAD_HEADER = "X-Gateway-Overhead-Ms"


def _overhead(arrived: float, engine_ms: float | None) -> str:
    return f"{overhead_ms(arrived, engine_ms):.1f}"


def _chunk(
    completion_id, created, model, delta=None, finish=None, usage=None, choices=True, overhead=None
) -> str:
    body = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else [],
    }
    if usage is not None or not choices:
        body["usage"] = usage
    if overhead is not None:
        body["gateway_overhead_ms"] = overhead
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _stream(turn, completion_id, created, model, include_usage, user):
    # A token chunk is the same JSON but for its text: built from two halves, one dumps a token.
    head, tail = (
        part.encode()
        for part in _chunk(completion_id, created, model, delta={"content": "\x00"}).split(
            json.dumps("\x00")
        )
    )
    try:
        yield _chunk(completion_id, created, model, delta={"role": "assistant", "content": ""})
        async for event in turn:
            if isinstance(event, pipeline.Token):
                yield head + orjson.dumps(event.text) + tail
            elif isinstance(event, pipeline.Done):
                end = _chunk(
                    completion_id,
                    created,
                    model,
                    finish=event.finish_reason,
                    overhead=event.overhead_ms,
                )
                if include_usage:
                    end += _chunk(
                        completion_id,
                        created,
                        model,
                        usage=event.usage or _zero_usage(),
                        choices=False,
                    )
                yield end + "data: [DONE]\n\n"
            elif isinstance(event, pipeline.Error):
                error = {
                    "message": await _message_for(event, user),
                    "type": "api_error",
                    "param": None,
                    "code": event.code,
                }
                yield f"data: {json.dumps({'error': error}, ensure_ascii=False)}\n\ndata: [DONE]\n\n"
    except Exception as exc:  # noqa: BLE001 - the headers are out: the failure is the stream's last event
        error = _failure({"method": "POST", "path": "/v1/chat/completions"}, exc).body["error"]
        yield f"data: {json.dumps({'error': error}, ensure_ascii=False)}\n\ndata: [DONE]\n\n"
    finally:
        await turn.aclose()


def _zero_usage() -> dict:
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


async def _complete(turn, completion_id, created, model, user):
    parts, done, error = [], None, None
    async for event in turn:
        if isinstance(event, pipeline.Token):
            parts.append(event.text)
        elif isinstance(event, pipeline.Done):
            done = event
        elif isinstance(event, pipeline.Error):
            error = event
    if error is not None:
        return await _pipeline_error(error, user)
    return Reply(
        200,
        headers={OVERHEAD_HEADER: f"{done.overhead_ms:.1f}"},
        body={
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(parts)},
                    "finish_reason": done.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": done.usage or _zero_usage(),
        },
    )


# --- ASGI ----------------------------------------------------------------------------------------------

_ROUTES = {"/v1/models": ("GET", models), "/v1/chat/completions": ("POST", chat_completions)}


async def application(scope, receive, send) -> None:
    """The /v1 API as an ASGI application; its database work goes to the process's database threads."""
    with db.unbound():
        await _serve(scope, receive, send)


async def _serve(scope, receive, send) -> None:
    arrived = time.monotonic()
    headers = {
        name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]
    }
    try:
        reply = _refuse(scope, headers) or await _dispatch(scope, receive, headers, arrived)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the client gets this API's error shape, the log the traceback
        reply = _failure(scope, exc)
    if reply.status >= 400:
        metrics.response_refused(
            RequestLog.Interface.V1,
            reply.status,
            (reply.body or {}).get("error", {}).get("code") or "",
        )
    # A reply that never reached an engine: every millisecond of it was the gateway's.
    reply.headers.setdefault(OVERHEAD_HEADER, _overhead(arrived, None))
    if reply.stream is None:
        await _send_json(send, reply)
    else:
        await _send_stream(send, receive, reply)


def _failure(scope, exc: Exception) -> Reply:
    outage = unavailable(
        exc
    )  # the database or Redis down: the client may retry, nothing is wrong with it
    if outage is not None:
        logger.warning(
            "%s %s: %s (%s: %s)", scope["method"], scope["path"], outage, type(exc).__name__, exc
        )
        return _error(
            503, str(outage), code=outage.code, headers={"Retry-After": str(outage.retry_after)}
        )
    logger.exception("%s %s failed", scope["method"], scope["path"])
    return _error(500, "The server failed to answer this request.", code="internal_error")


async def _dispatch(scope, receive, headers: dict[str, str], arrived: float) -> Reply:
    method, view = _ROUTES[scope["path"]]
    if scope["method"] != method:
        return _error(405, f"Use {method}.", code="method_not_allowed")
    if method == "GET":
        return await view(headers)
    body = await _read_body(receive, headers)
    return body if isinstance(body, Reply) else await view(headers, body, arrived)


def _refuse(scope, headers: dict[str, str]) -> Reply | None:
    """What Django's middleware would refuse before a view runs, in this API's error shape."""
    if scope["path"] not in _ROUTES:
        return _error(
            404,
            f"No route {scope['path']}; this API serves {', '.join(_ROUTES)}.",
            code="not_found",
        )
    domain, _ = split_domain_port(headers.get("host", ""))
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return _error(
            400, "The Host header names a host this server does not serve.", code="bad_host"
        )
    if settings.SECURE_SSL_REDIRECT and not _secure(scope, headers):
        # An API client does not follow a redirect with its body; say what to do instead.
        return _error(403, "This API is served over HTTPS only.", code="https_required")
    return None


def _secure(scope, headers: dict[str, str]) -> bool:
    if scope.get("scheme") == "https":
        return True
    proxy = settings.SECURE_PROXY_SSL_HEADER
    if proxy:
        name, value = proxy
        return (
            headers.get(name.removeprefix("HTTP_").replace("_", "-").lower(), "")
            .split(",")[0]
            .strip()
            == value
        )
    return False


async def _read_body(receive, headers: dict[str, str]) -> bytes | Reply:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    too_large = _error(
        413, f"The request body is too large: at most {limit} bytes.", code="request_too_large"
    )
    try:
        if int(headers.get("content-length") or 0) > limit:
            return too_large  # refused before a byte of it is read
    except ValueError:
        return _error(400, "The Content-Length header is not a number.")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError  # the client is gone: nothing to answer
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return too_large
        if not message.get("more_body"):
            return b"".join(chunks)


def _head(reply: Reply, content_type: str) -> dict:
    headers = {"Content-Type": content_type, "X-Content-Type-Options": "nosniff", **reply.headers}
    if settings.SECURE_REFERRER_POLICY:
        headers["Referrer-Policy"] = settings.SECURE_REFERRER_POLICY
    return {
        "type": "http.response.start",
        "status": reply.status,
        "headers": [
            (name.encode("latin-1"), str(value).encode("latin-1"))
            for name, value in headers.items()
        ],
    }


async def _send_json(send, reply: Reply) -> None:
    body = json.dumps(reply.body, ensure_ascii=False).encode()
    await send(_head(reply, "application/json"))
    await send({"type": "http.response.body", "body": body})


async def _send_stream(send, receive, reply: Reply) -> None:
    """Stream the events; a client that hangs up cancels the answer (and the engine's request)."""
    streaming = asyncio.current_task()
    gone = False

    async def watch():
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        streaming.cancel()

    watcher = asyncio.create_task(watch())
    try:
        await send(_head(reply, reply.headers.pop("Content-Type")))
        async with contextlib.aclosing(reply.stream) as events:
            async for text in events:
                body = text if isinstance(text, bytes) else text.encode()
                await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    except asyncio.CancelledError:
        if not gone:
            raise  # the server is stopping, not the client
        streaming.uncancel()
    finally:
        watcher.cancel()
