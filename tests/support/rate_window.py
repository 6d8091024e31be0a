"""A rate-limit window a whole test fits in: the chat limits count in fixed windows
(chat.services._rate_window), so a test that makes N requests and expects the next refused fails
when a window ends between them."""

import time


def one_rate_window(settings, seconds: int = 86400) -> None:
    """Windows of `seconds` (a day), and a fresh one if less than a minute of this one is left."""
    settings.CHAT_RATE_WINDOW = seconds
    left = seconds - time.time() % seconds
    if left < 60:
        time.sleep(left + 0.5)
