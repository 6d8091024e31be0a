"""An exclusive lock on a file, across processes: one of them prepares a cached artefact
(a build, an export) while the others wait for it instead of doing the same work."""

import contextlib
import fcntl
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive(path: Path, *, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold `path` locked (creating it and its folder); `on_wait` runs once if another holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
