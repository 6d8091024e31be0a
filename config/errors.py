"""Domain errors become HTTP errors in one place.

Each app's exceptions subclass DomainError with an HTTP status and a stable
code; DRF's exception handler below turns them into
`{"error": {"code", "message", "fields"}}` with that status, so no view
translates errors by hand and no domain error surfaces as a 500.
"""


class DomainError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str = "", *, fields: dict[str, str] | None = None):
        self.fields = fields or {}
        super().__init__(message or "; ".join(f"{k}: {v}" for k, v in self.fields.items()))


def api_exception_handler(exc, context):
    # Imported here: DRF's settings import the apps' authentication classes, which import this module.
    from django.core.exceptions import RequestDataTooBig
    from rest_framework.response import Response
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, RequestDataTooBig):
        return Response({"error": {"code": "request_too_large", "message": "The request body is too large.",
                                   "fields": {}}}, status=413)
    if isinstance(exc, DomainError):
        headers = {"Retry-After": str(exc.retry_after)} if getattr(exc, "retry_after", None) else None
        body = {"error": {"code": exc.code, "message": str(exc), "fields": exc.fields}}
        return Response(body, status=exc.status, headers=headers)
    return drf_exception_handler(exc, context)
