"""An exclusive lock on a file, across processes: one of them prepares a cached artefact (a
build, an export, an embedded server) while the others wait for it instead of doing the same work.
The lock itself is the `filelock` library's; this adds the "someone else is at it" notice."""

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout


@contextlib.contextmanager
def exclusive(path: Path, *, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold `path` locked (creating its folder); `on_wait` runs once if another holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # The file stays: removing it on release would let a waiter and a newcomer lock two inodes at
    # once.
    lock = FileLock(path, thread_local=False, preserve_lock_file=True)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        if on_wait is not None:
            on_wait()
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
