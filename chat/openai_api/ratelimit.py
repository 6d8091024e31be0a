"""OpenAI's x-ratelimit-* headers: the caller's tightest request and token limits after a request
(spend's Standing), written as OpenAI's clients read them, on every /v1 answer and refusal a
limit applies to."""

from spend.ledger.reads import Standing, duration


def ratelimit_headers(standing: Standing) -> dict[str, str]:
    found = {}
    for name, window in (("requests", standing.requests), ("tokens", standing.tokens)):
        if window is not None:
            found[f"x-ratelimit-limit-{name}"] = str(window.limit)
            found[f"x-ratelimit-remaining-{name}"] = str(max(0, window.remaining))
            found[f"x-ratelimit-reset-{name}"] = duration(window.reset)
    return found
