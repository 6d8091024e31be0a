"""Waiting for what another process or thread writes a moment later."""

import time


def wait_until(predicate, timeout=30.0, step=0.1):
    """The first truthy value `predicate()` returns within `timeout` seconds, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None
