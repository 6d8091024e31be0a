"""The deadlines of a streamed response's reads (first token, idle, total), kept by one timer
per stream rather than one per read."""

from __future__ import annotations

import asyncio
from typing import Literal


class StreamDeadline:
    """The read timeouts of one stream with one timer: until the first token, the `first`
    deadline; after it, `idle` seconds from the start of each read; never past `total`.
    Wrap each read in `with deadline:`; a read that outlives its deadline raises TimeoutError
    (the task is cancelled and uncancelled, as in asyncio.timeout).

    `asyncio.timeout_at` around each read would schedule and cancel a timer per network read;
    here a read only notes the time, and the one timer, when it fires early, moves itself to
    the deadline the reads since have earned."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, first: float, total: float, idle: float):
        self._loop, self._first, self._total, self._idle = loop, first, total, idle
        self._read_started: float | None = None  # None until the first token
        self._task: asyncio.Task | None = None
        self._cancelling = 0
        self._fired = False
        self._timer: asyncio.TimerHandle | None = loop.call_at(first, self._fire)

    def first_token(self) -> None:
        self._read_started = self._loop.time()

    def _due(self) -> float:
        if self._read_started is None:
            return self._first
        return min(self._total, self._read_started + self._idle)

    def __enter__(self) -> None:
        self._task = asyncio.current_task()
        self._cancelling = self._task.cancelling()  # type: ignore[union-attr]  # entered inside a task
        if self._read_started is not None:
            self._read_started = self._loop.time()
        if self._timer is None:  # it fired while the consumer had the last token
            self._timer = self._loop.call_at(self._due(), self._fire)

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        task, self._task = self._task, None
        if self._fired:
            self._fired = False
            if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:  # type: ignore[union-attr]  # entered inside a task
                raise TimeoutError from None
        return False

    def _fire(self) -> None:
        due = self._due()
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._fire)
        elif self._task is not None:
            self._timer = None
            self._fired = True
            self._task.cancel()
        else:
            self._timer = None  # re-armed by the next read, from its own start

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
