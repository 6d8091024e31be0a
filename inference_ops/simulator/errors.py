"""vLLM's error bodies: `{"error": {"message", "type", "param", "code"}}` with the HTTP status as
`code`, in the three forms vLLM 0.32 produces them (entrypoints/serve/exception_handling):

- a request that fails pydantic's validation (a wrong type, a missing field, JSON that does not
  parse) is FastAPI's RequestValidationError: type "Bad Request", the errors listed in the
  message, `param` the dotted location of the first;
- a request a vLLM check refuses raises VLLMValidationError: type "BadRequestError", and the
  message is the exception's str(), which appends "(parameter=..., value=...)";
- anything else is raised with its own type and status.
"""

import functools
import json

# What the OpenAI SDK and vLLM clients see as the server's engine message when generation fails
# (vLLM's EngineDeadError text).
ENGINE_ERROR_MESSAGE = (
    "EngineCore encountered an issue. See stack trace (above) for the root cause."
)

# Compact like pydantic's model_dump_json and Starlette's JSONResponse, which is what vLLM sends.
dumps = functools.partial(json.dumps, separators=(",", ":"))

_MISSING = object()


class APIError(Exception):
    def __init__(
        self,
        message: str,
        *,
        err_type: str = "BadRequestError",
        status: int = 400,
        param: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.err_type = err_type
        self.status = status
        self.param = param

    def body(self) -> dict:
        return error_body(
            self.message, err_type=self.err_type, status=self.status, param=self.param
        )


def error_body(message: str, *, err_type: str, status: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def vllm_error(message: str, *, parameter: str | None = None, value=None) -> APIError:
    """A VLLMValidationError as vLLM answers it (400 BadRequestError)."""
    extras = []
    if parameter is not None:
        extras.append(f"parameter={parameter}")
    if value is not None:
        extras.append(f"value={value}")
    if extras:
        message = f"{message} ({', '.join(extras)})"
    return APIError(message, param=parameter)


def validation_error(
    loc: str, msg: str, kind: str, value=_MISSING, ctx: dict | None = None
) -> APIError:
    """A RequestValidationError as vLLM answers it: a look-alike of pydantic's first error (real
    messages list one error per branch of a union; clients only show them)."""
    where = "body" if loc == "body" else f"body.{loc}"
    error = {"type": kind, "loc": where, "msg": msg, "input": _summary(value)}
    if ctx is not None:
        error["ctx"] = ctx
    return APIError(f"1 validation error:\n  {error}", err_type="Bad Request", param=where)


def _summary(value) -> object:
    # vLLM bounds the echoed input: containers are described, long strings cut.
    if value is _MISSING:
        return "<dict of 0 items>"
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:200] + "...[truncated]"
    if isinstance(value, (list, tuple, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)
