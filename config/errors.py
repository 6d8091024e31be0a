"""Domain errors become HTTP errors in one place.

Each app's exceptions subclass DomainError with an HTTP status and a stable
code; DRF's exception handler below turns them into
`{"error": {"code", "message", "fields"}}` with that status, so no view
translates errors by hand and no domain error surfaces as a 500.
"""

from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


class DomainError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str = "", *, fields: dict[str, str] | None = None):
        self.fields = fields or {}
        super().__init__(message or "; ".join(f"{k}: {v}" for k, v in self.fields.items()))


def api_exception_handler(exc, context):
    if isinstance(exc, DomainError):
        body = {"error": {"code": exc.code, "message": str(exc), "fields": exc.fields}}
        return Response(body, status=exc.status)
    return drf_exception_handler(exc, context)
