from core.errors import DomainError, ServiceUnavailable


class ChatError(DomainError):
    """Base of the chat layer's domain errors."""


class SessionNotFound(ChatError):
    status = 404
    code = "not_found"


class MessageInvalid(ChatError):
    code = "invalid_message"


class MessageTooLarge(ChatError):
    status = 413
    code = "message_too_large"


class RateLimited(ChatError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int):
        self.retry_after = retry_after
        super().__init__(message)


class TooManyStreams(RateLimited):
    """The user already has CHAT_MAX_STREAMS_PER_USER answers in progress."""

    code = "too_many_streams"


class ApiKeyInvalid(ChatError):
    code = "invalid_api_key"


class Draining(ServiceUnavailable):
    """This process is shutting down (config.drain) and takes no new turns: a retryable 503."""

    code = "draining"
