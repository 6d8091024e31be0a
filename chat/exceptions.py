from core.errors import DomainError, ServiceUnavailable


class ChatError(DomainError):
    """Base of the chat layer's domain errors."""


class SessionNotFound(ChatError):
    status = 404
    code = "not_found"


class MessageInvalid(ChatError):
    code = "invalid_message"


class SearchInvalid(ChatError):
    code = "invalid_search"


class MessageTooLarge(ChatError):
    status = 413
    code = "message_too_large"


class AnswerNotFinished(ChatError):
    status = 409
    code = "answer_not_finished"


class NotLastExchange(ChatError):
    """A regenerate or an edit of an exchange that is not the session's last."""

    status = 409
    code = "not_last_exchange"


class RateLimited(ChatError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int):
        self.retry_after = retry_after
        super().__init__(message)


class TooManyStreams(RateLimited):
    """The user already has CHAT_MAX_STREAMS_PER_USER answers in progress."""

    code = "too_many_streams"


class SpendRefused(ChatError):
    """A spend limit or budget refused the answer (spend.ledger): the DRF API's 429 (503 when the
    limits could not be counted), with Retry-After when waiting helps."""

    status = 429

    def __init__(self, message: str, *, code: str, retry_after: int | None):
        self.code = code
        self.status = 503 if code == "limits_unavailable" else 429
        self.retry_after = retry_after
        super().__init__(message)


# The pipeline's error codes that are a spend refusal, not a failure; and "busy": no room at an
# endpoint's capacity within the request's deadline (inference_ops.admission), a 429 as well.
SPEND_REFUSALS = frozenset({"limit_exceeded", "budget_exceeded", "limits_unavailable", "busy"})


class ApiKeyInvalid(ChatError):
    code = "invalid_api_key"


class Draining(ServiceUnavailable):
    """This process is shutting down (config.drain) and takes no new turns: a retryable 503."""

    code = "draining"
