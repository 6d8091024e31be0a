from typing import ClassVar

from core.errors import DomainError


class InferenceError(DomainError):
    """Base of the inference layer's domain errors."""


class EngineError(InferenceError):
    """One failed call to a model engine, whatever the cause.

    `kind` says what happened; `retryable` whether another attempt (or another
    target) may succeed; `produced_tokens` whether any token reached the caller,
    after which the pipeline must not switch targets.
    """

    status = 502
    code = "engine_error"

    KINDS: ClassVar[dict[str, bool]] = {
        # kind: retryable
        "connect": True,  # refused, reset, DNS: nothing reached the engine
        "timeout_connect": True,
        "timeout_first_token": True,
        "timeout_idle": True,  # the stream stalled between tokens
        "timeout_total": False,  # the request's own budget ran out
        "rate_limited": True,  # HTTP 429
        "server_error": True,  # HTTP 5xx
        "client_error": False,  # HTTP 4xx other than 429: the request itself is wrong
        "stream_error": True,  # an error frame inside the SSE stream
        "stream_truncated": True,  # the stream ended without a finish reason or [DONE]
        "malformed": False,  # a chunk that is not the API's JSON
        # HTTP 400s that say what of the request failed: the prompt is over the engine's context
        # window (a target with a larger one may take it), a content policy refused it (the same
        # anywhere: passed to the client with the provider's reason).
        "context_length": False,
        "content_filter": False,
        # No room at the endpoint's capacity within the request's deadline (admission): the
        # gateway's own queue, not the engine's failure; another target may have room.
        "busy": True,
    }

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        produced_tokens: bool = False,
        status_code: int | None = None,
        endpoint: str = "",
        retry_after: float | None = None,
    ):
        if kind not in self.KINDS:
            raise ValueError(f"unknown engine error kind {kind!r}")
        self.kind = kind
        self.retryable = self.KINDS[kind]
        self.produced_tokens = produced_tokens
        self.status_code = status_code
        self.endpoint = endpoint
        self.retry_after = (
            retry_after  # seconds the engine asked to be left alone (429/503 Retry-After)
        )
        self.detail = message  # what failed, without the endpoint's name
        self.chunks = 0  # the stream's chunks that reached the caller before it failed
        super().__init__(f"{endpoint + ': ' if endpoint else ''}{message}")

    @property
    def refuses_request(self) -> bool:
        """The engine refused the request as the client sent it (a field's value it does not
        take): the client's to fix, not the operator's, and the same anywhere."""
        return self.kind == "client_error" and self.status_code in (400, 413, 422)


class SupervisorError(InferenceError):
    """An engine could not be started, stopped or changed as asked."""

    status = 409
    code = "engine_supervision"


class EngineStartRefused(SupervisorError):
    """Refused before launching anything (port taken, kind not launchable)."""
