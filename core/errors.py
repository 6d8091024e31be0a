"""Domain errors become HTTP errors in one place.

Each app's exceptions subclass DomainError with an HTTP status and a stable
code; DRF's exception handler below turns them into
`{"error": {"code", "message", "fields"}}` with that status, so no view
translates errors by hand and no domain error surfaces as a 500. DRF's own
errors (validation, parse, authentication, permission) get the same shape.
Both JSON shapes are built here: `error_body` (the gateway's) and `openai_error_body` (/v1's),
for the handlers, the /v1 application and the body limit at the server's edge alike.

An outage of PostgreSQL or Redis is no bug of the request either: `unavailable`
names it as a ServiceUnavailable (503 with Retry-After), for this handler, the
/v1 API and the chat socket alike. Nothing is cached about the outage: the next
request tries again, so service comes back by itself when the dependency does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Seconds a client is asked to wait after an outage of the database or Redis: about what a
# restart or a failover takes, and short enough that nobody waits long after it.
RETRY_AFTER = 5


class DomainError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str = "", *, fields: dict[str, str] | None = None):
        self.fields = fields or {}
        super().__init__(message or "; ".join(f"{k}: {v}" for k, v in self.fields.items()))


class ServiceUnavailable(DomainError):
    status = 503
    code = "unavailable"

    def __init__(self, message: str, *, retry_after: int = RETRY_AFTER):
        self.retry_after = retry_after
        super().__init__(message)


def unavailable(exc: BaseException) -> ServiceUnavailable | None:
    """The outage behind `exc` (the database or Redis cannot be reached, or dropped the
    connection), or None when `exc` is something else. Django's wrapped database errors are
    recognised by their cause."""
    import psycopg
    import redis
    from django.db import utils as db_utils

    if isinstance(exc, ServiceUnavailable):
        return exc
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return ServiceUnavailable(f"Redis is unavailable right now. Try again in {RETRY_AFTER} s.")
    if isinstance(
        exc, (psycopg.OperationalError, db_utils.OperationalError, db_utils.InterfaceError)
    ):
        return ServiceUnavailable(
            f"The database is unavailable right now. Try again in {RETRY_AFTER} s."
        )
    return None


def error_body(code: str, message: str, fields: dict[str, str] | None = None) -> dict:
    """The gateway's error shape, the one every API but /v1 answers with."""
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "api_error",
}


def openai_error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict:
    """OpenAI's error shape, the one /v1 answers with."""
    return {
        "error": {
            "message": message,
            "type": _OPENAI_TYPES.get(status, "api_error"),
            "param": param,
            "code": code,
        }
    }


def _flatten(detail, prefix: str = "") -> dict[str, str]:
    """DRF's nested error detail as {"field" or "field.0.sub": "messages"}."""
    items: Iterable[tuple[Any, Any]]
    if isinstance(detail, dict):
        items = detail.items()
    elif isinstance(detail, list) and any(isinstance(d, (dict, list)) for d in detail):
        items = ((str(i), d) for i, d in enumerate(detail))
    else:
        messages = detail if isinstance(detail, list) else [detail]
        return {prefix or "non_field_errors": " ".join(str(m) for m in messages)}
    fields = {}
    for name, value in items:
        fields.update(_flatten(value, f"{prefix}.{name}" if prefix else str(name)))
    return fields


def _drf_error(exc) -> dict:
    from rest_framework.exceptions import ValidationError

    if isinstance(exc, ValidationError):
        fields = _flatten(exc.detail)
        message = "; ".join(
            text if name == "non_field_errors" else f"{name}: {text}"
            for name, text in fields.items()
        )
        return error_body("invalid", message, fields)
    code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
    return error_body(code, str(exc.detail))


def api_exception_handler(exc, context):
    # Imported here: DRF's settings import the apps' authentication classes, which import this
    # module.
    from django.core.exceptions import RequestDataTooBig
    from rest_framework.exceptions import APIException
    from rest_framework.response import Response
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, RequestDataTooBig):
        return Response(
            error_body("request_too_large", "The request body is too large."), status=413
        )
    exc = unavailable(exc) or exc
    if isinstance(exc, DomainError):
        retry_after = getattr(exc, "retry_after", None)
        headers = {"Retry-After": str(retry_after)} if retry_after else None
        body = error_body(exc.code, str(exc), exc.fields)
        return Response(body, status=exc.status, headers=headers)
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, APIException):
        response.data = _drf_error(exc)
    return response


def server_error(request):
    """handler500. A page that failed because the database or Redis cannot be reached is an
    outage, not a bug: a 503 page with Retry-After, as the APIs answer. Anything else gets
    Django's own 500 page."""
    import sys

    from django.http import HttpResponse
    from django.utils.html import escape
    from django.views.defaults import server_error as django_server_error

    failure = sys.exc_info()[1]  # handler500 runs while Django handles the exception
    outage = unavailable(failure) if failure is not None else None
    if outage is None:
        return django_server_error(request)
    response = HttpResponse(
        '<!doctype html><html lang="en"><meta charset="utf-8">'
        "<title>Temporarily unavailable</title>"
        f"<h1>Temporarily unavailable</h1><p>{escape(str(outage))}</p></html>",
        status=503,
        content_type="text/html; charset=utf-8",
    )
    response["Retry-After"] = str(outage.retry_after)
    return response
