"""The /v1 API as a bare ASGI application (config.asgi sends `/v1/` here), not a Django view.

Every request of this API is async end to end on the event loop. Django's handler would add a
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
import time

from django.conf import settings
from django.http.request import split_domain_port, validate_host

from chat.openai_api.completions_api import completions
from chat.openai_api.embeddings_api import embeddings
from chat.openai_api.handlers import chat_completions, completion_update, models
from chat.openai_api.replies import (
    OVERHEAD_HEADER,
    Reply,
    error_reply,
    failure_reply,
    overhead_header,
)
from core import db
from observability import metrics
from observability.models import RequestLog

_ROUTES = {
    "/v1/models": ("GET", models),
    "/v1/chat/completions": ("POST", chat_completions),
    "/v1/completions": ("POST", completions),
    "/v1/embeddings": ("POST", embeddings),
}
# `/v1/chat/completions/{id}`: a verdict on one answer (handlers.completion_update).
_COMPLETION = "/v1/chat/completions/"


def _route(path: str):
    """(method, view, the id in the path or None), or None for a path this API does not serve."""
    if path in _ROUTES:
        return (*_ROUTES[path], None)
    completion = path.removeprefix(_COMPLETION)
    if completion != path and completion and "/" not in completion:
        return "POST", completion_update, completion
    return None


async def application(scope, receive, send) -> None:
    """The /v1 API; its database work goes to the process's database threads."""
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
    except Exception as exc:  # noqa: BLE001 - the client gets this API's error shape
        reply = failure_reply(exc, method=scope["method"], path=scope["path"])
    if reply.status >= 400:
        metrics.response_refused(
            RequestLog.Interface.V1,
            reply.status,
            (reply.body or {}).get("error", {}).get("code") or "",
        )
    # A reply that never reached an engine: every millisecond of it was the gateway's.
    reply.headers.setdefault(OVERHEAD_HEADER, overhead_header(arrived, None))
    if reply.stream is None:
        await _send_json(send, reply)
    else:
        await _send_stream(send, receive, reply)


async def _dispatch(scope, receive, headers: dict[str, str], arrived: float) -> Reply:
    method, view, named = _route(scope["path"])
    if scope["method"] != method:
        return error_reply(405, f"Use {method}.", code="method_not_allowed")
    if method == "GET":
        return await view(headers)
    body = await _read_body(receive, headers)
    if isinstance(body, Reply):
        return body
    if named is not None:
        return await view(headers, body, arrived, named)
    return await view(headers, body, arrived)


def _refuse(scope, headers: dict[str, str]) -> Reply | None:
    """What Django's middleware would refuse before a view runs, in this API's error shape."""
    if _route(scope["path"]) is None:
        return error_reply(
            404,
            f"No route {scope['path']}; this API serves {', '.join(_ROUTES)} and "
            f"{_COMPLETION}{{id}}.",
            code="not_found",
        )
    domain, _ = split_domain_port(headers.get("host", ""))
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return error_reply(
            400, "The Host header names a host this server does not serve.", code="bad_host"
        )
    if settings.SECURE_SSL_REDIRECT and not _secure(scope, headers):
        # An API client does not follow a redirect with its body; say what to do instead.
        return error_reply(403, "This API is served over HTTPS only.", code="https_required")
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
    too_large = error_reply(
        413, f"The request body is too large: at most {limit} bytes.", code="request_too_large"
    )
    try:
        if int(headers.get("content-length") or 0) > limit:
            return too_large  # refused before a byte of it is read
    except ValueError:
        return error_reply(400, "The Content-Length header is not a number.")
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
        streaming.cancel()  # type: ignore[union-attr]  # called in a task

    watcher = asyncio.create_task(watch())
    try:
        await send(_head(reply, reply.headers.pop("Content-Type")))
        async with contextlib.aclosing(reply.stream) as events:  # type: ignore[type-var]  # a streaming reply has its stream
            async for text in events:  # type: ignore[union-attr]  # a streaming reply has its stream
                body = text if isinstance(text, bytes) else text.encode()
                await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    except asyncio.CancelledError:
        if not gone:
            raise  # the server is stopping, not the client
        streaming.uncancel()  # type: ignore[union-attr]  # called in a task
    finally:
        watcher.cancel()
