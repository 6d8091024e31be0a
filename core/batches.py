"""Rows that requests note in memory and a daemon thread writes in batches, off the hot path.

A request calls `BatchWriter.note(row)`: it appends to a bounded in-process buffer and returns,
with no I/O. A daemon thread per writer and process writes what waits, one call of `write`
per batch, every `interval` seconds or sooner when `rows` wait, and closes its database
connection after each batch so it never keeps one from the pool. The KB misses and the
request log are written this way.

These are analytics: when the database is away the buffer keeps the newest `capacity` rows and
counts the ones it drops; nothing here ever raises into a request. A batch the database could
not take (connection lost) goes back into the buffer to be tried again, so `write` must store a
batch at most once however often it is given (a key per row and ON CONFLICT DO NOTHING); a batch
the database refuses is dropped and counted, so one bad row cannot block the buffer forever.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from django.db import InterfaceError, OperationalError, connection

logger = logging.getLogger(__name__)

Row = TypeVar("Row")


@dataclass(frozen=True)
class BufferStats:
    buffered: int  # waiting in this process
    written: int  # rows written since the process started
    dropped: int  # lost since the process started: the buffer was full, or a batch was refused


class BatchWriter(Generic[Row]):
    """See the module docstring. The limits are callables, read on each use, so that settings
    changed at run time (and in tests) apply."""

    def __init__(
        self,
        *,
        name: str,
        write: Callable[[list[Row]], int],
        capacity: Callable[[], int],
        rows: Callable[[], int],
        interval: Callable[[], float],
    ):
        self.name = name
        self._write_batch = write
        self._capacity, self._rows, self._interval = capacity, rows, interval
        self._buffer: deque[Row] = deque()
        self._written = 0
        self._dropped = 0
        self._reset_locks()
        atexit.register(self._flush_at_exit)
        os.register_at_fork(after_in_child=self._forget_after_fork)

    def _reset_locks(self) -> None:
        self._lock = (
            threading.Lock()
        )  # guards the buffer and the counters; held for a few operations only
        # One writer at a time, so `flush` also waits for a batch the thread has in flight.
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._oldest_at = 0.0  # monotonic time of the oldest row waiting
        self._thread: threading.Thread | None = None

    def note(self, row: Row) -> None:
        """Keep `row` for the next batch. Safe on the event loop: it appends to memory and
        returns."""
        capacity = self._capacity()
        with self._lock:
            if not self._buffer:
                self._oldest_at = time.monotonic()
            while len(self._buffer) >= capacity:
                self._buffer.popleft()
                self._dropped += 1
            self._buffer.append(row)
            waiting = len(self._buffer)
        if self._thread is None:
            self._start()
        if waiting == 1 or waiting >= self._rows():
            self._wake.set()

    def flush(self) -> int:
        """Write every waiting row now, in the caller's thread and database connection; the number
        written. For tests and for process exit. Database errors are raised to the caller (the rows
        of a batch that met an unreachable database go back into the buffer)."""
        written = 0
        while True:
            with self._write_lock:
                batch = self._take()
                if not batch:
                    return written
                written += self._write(batch)

    def discard(self) -> int:
        """Forget the waiting rows (after a batch in flight is written); how many. For tests: rows
        an earlier test noted belong to a database that is gone."""
        with self._write_lock, self._lock:
            waiting = len(self._buffer)
            self._buffer.clear()
            return waiting

    def stats(self) -> BufferStats:
        with self._lock:
            return BufferStats(
                buffered=len(self._buffer), written=self._written, dropped=self._dropped
            )

    def _take(self) -> list[Row]:
        # `_oldest_at` stays as it is: the rows left behind are younger, so at worst the next
        # batch leaves a little early.
        with self._lock:
            return [self._buffer.popleft() for _ in range(min(self._rows(), len(self._buffer)))]

    def _due_in(self) -> float | None:
        """Seconds until the waiting rows are due for a batch (0: now); None when none wait."""
        with self._lock:
            if not self._buffer:
                return None
            if len(self._buffer) >= self._rows():
                return 0.0
            return max(0.0, self._oldest_at + self._interval() - time.monotonic())

    def _write(self, batch: list[Row]) -> int:
        try:
            stored = self._write_batch(batch)
        except (OperationalError, InterfaceError):
            self._requeue(batch)
            raise
        except Exception:
            with self._lock:
                self._dropped += len(batch)
            raise
        with self._lock:
            self._written += stored
        return stored

    def _requeue(self, batch: list[Row]) -> None:
        capacity = self._capacity()
        with self._lock:
            self._buffer.extendleft(reversed(batch))
            while len(self._buffer) > capacity:
                self._buffer.popleft()
                self._dropped += 1
            self._oldest_at = time.monotonic()

    def _run(self) -> None:
        reported = self.stats().dropped
        while True:
            wait = self._due_in()
            if wait is None or wait > 0:
                # Woken early by the first row into an empty buffer and by a full batch.
                self._wake.wait(timeout=wait if wait is not None else self._interval())
                self._wake.clear()
                continue
            if not self._thread_batch():
                # Whatever broke (the database, most likely) gets an interval before the next try.
                time.sleep(self._interval())
            dropped = self.stats().dropped
            if dropped > reported:
                logger.warning(
                    "%d %s dropped (buffer full or batch refused); %d in all",
                    dropped - reported,
                    self.name,
                    dropped,
                )
                reported = dropped

    def _thread_batch(self) -> bool:
        """One batch from the writer thread; False when it failed (and was logged)."""
        ok = True
        try:
            with self._write_lock:
                batch = self._take()
                if batch:
                    self._write(batch)
        except Exception:  # analytics must never take the thread down
            logger.warning("could not write a batch of %s", self.name, exc_info=True)
            ok = False
        try:
            # Back to the pool after each batch: this thread sleeps most of the time.
            connection.close()
        except Exception:
            logger.warning("could not close the %s writer's connection", self.name, exc_info=True)
        return ok

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"{self.name.replace(' ', '-')}-writer", daemon=True
            )
        try:
            self._thread.start()
        except RuntimeError:  # no thread to be had: the next row tries again, the request goes on
            logger.warning("could not start the %s writer", self.name, exc_info=True)
            self._thread = None

    def _flush_at_exit(self) -> None:
        try:
            self.flush()
        except Exception:  # the process is leaving; say what was lost
            logger.warning(
                "could not write %d %s at exit", self.stats().buffered, self.name, exc_info=True
            )

    def _forget_after_fork(self) -> None:
        # A forked child has the parent's buffer contents but not its thread: start afresh.
        self._buffer.clear()
        self._reset_locks()
