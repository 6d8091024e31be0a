"""The openai SDK's failures, each as one `EngineError`: its kind (what failed, and whether
before the response or during the stream), whether tokens were already produced, and how long
an engine that refused asked to be left alone."""

from __future__ import annotations

import datetime
import email.utils
import json
import re

import httpx2
import openai

from inference_ops.exceptions import EngineError


def engine_error_from_sdk(
    exc: Exception, *, produced: bool, during_request: bool, endpoint: str
) -> EngineError:
    if isinstance(exc, openai.APITimeoutError):
        if isinstance(exc.__cause__, httpx2.ConnectTimeout):
            # The aiohttp transport reports every connection failure as a connect timeout; the
            # error underneath says whether one was (a refused or reset connection was not).
            root = exc.__cause__.__cause__
            kind = (
                "connect"
                if root is not None and not isinstance(root, TimeoutError)
                else "timeout_connect"
            )
        else:
            kind = "timeout_idle" if produced else "timeout_first_token"
        return EngineError(
            kind, "the engine did not answer in time", produced_tokens=produced, endpoint=endpoint
        )
    if isinstance(exc, openai.APIConnectionError):
        kind = "connect" if during_request else "stream_truncated"
        return EngineError(
            kind,
            f"connection failed: {exc.__cause__ or exc}",
            produced_tokens=produced,
            endpoint=endpoint,
        )
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        kind = (
            "rate_limited" if status == 429 else "server_error" if status >= 500 else "client_error"
        )
        message = f"HTTP {status}: {exc.message}"
        if kind == "client_error":
            kind = _refusal_kind(exc) or kind
            if kind == "content_filter":
                message = _provider_message(exc)  # the provider's reason, for the client
        return EngineError(
            kind,
            message,
            produced_tokens=produced,
            status_code=status,
            endpoint=endpoint,
            retry_after=retry_after(exc.response.headers) if status in (429, 503) else None,
        )
    if isinstance(exc, openai.APIError):
        return EngineError(
            "stream_error",
            f"error in the stream: {exc.message}",
            produced_tokens=produced,
            endpoint=endpoint,
        )
    return EngineError(
        "malformed", f"unreadable response: {exc}", produced_tokens=produced, endpoint=endpoint
    )


# vLLM's 400s for a prompt over --max-model-len (its versions word it differently) and OpenAI's.
_CONTEXT_LENGTH = re.compile(
    r"maximum context length|maximum model length|context length|context window", re.IGNORECASE
)
_CONTEXT_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})
# OpenAI's (and Azure OpenAI's) content-policy refusals.
_FILTER_CODES = frozenset({"content_filter", "content_policy_violation"})


def _refusal_kind(exc: openai.APIStatusError) -> str | None:
    """What a 4xx says of the request, when it says one of the two things a gateway acts on: the
    prompt is too long for this engine, or a content policy refused it."""
    code = exc.code if isinstance(exc.code, str) else None
    if code in _FILTER_CODES:
        return "content_filter"
    if exc.status_code == 400 and (
        code in _CONTEXT_CODES or _CONTEXT_LENGTH.search(exc.message or "")
    ):
        return "context_length"
    return None


def _provider_message(exc: openai.APIStatusError) -> str:
    """The error's own message as the provider wrote it, without the SDK's status preamble."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        if isinstance(inner.get("message"), str) and inner["message"]:  # type: ignore[union-attr, index]  # a dict: body or its error
            return inner["message"]  # type: ignore[index]  # a dict: body or its error
    return exc.message


def retry_after(headers) -> float | None:
    """Seconds from a response's `Retry-After` (seconds or an HTTP date) or OpenAI's
    `retry-after-ms`; None when absent or unreadable."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


# What the SDK may raise while it sends a request and reads the response headers.
SDK_ERRORS = (openai.APIError, json.JSONDecodeError, ValueError, TypeError, AttributeError)
