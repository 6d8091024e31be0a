"""The Celery worker as `make run` and the tests start it: its command line, and a start that
waits until the worker answers a ping. One place, so the queues and options cannot drift apart
between the demo and the tests that stand for it."""

import os
import subprocess
import sys
import time
from pathlib import Path

from core.processes import stop_group

# Every queue a task goes to (config/celery.py routes them); production runs its own workers.
QUEUES = "default,ops,embeddings"


def worker_command(*, hostname: str, concurrency: int, queues: str = QUEUES) -> list[str]:
    """The argv of a Celery worker of this project named `hostname` (`%h` is the machine's)."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "-Q",
        queues,
        "-c",
        str(concurrency),
        "-l",
        "INFO",
        "-n",
        hostname,
    ]


def beat_command(*, schedule: str) -> list[str]:
    """The argv of Celery beat keeping its schedule state in the file `schedule`."""
    return [sys.executable, "-m", "celery", "-A", "config", "beat", "-l", "INFO", "-s", schedule]


def worker_start(
    *,
    hostname: str,
    env: dict[str, str],
    log_path: Path,
    cwd: Path,
    concurrency: int = 1,
    queues: str = QUEUES,
    timeout: float = 60,
) -> subprocess.Popen:
    """A worker leading a session of its own, its output appended to `log_path`, returned once it
    answers a ping through the broker of `env`'s settings. A worker that exits or stays silent for
    `timeout` is stopped and RuntimeError raised with its log."""
    from config.celery import app

    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            worker_command(hostname=hostname, concurrency=concurrency, queues=queues),
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    expected = hostname.replace("%h", os.uname().nodename)
    deadline = time.monotonic() + timeout
    while not any(expected in reply for reply in app.control.ping(timeout=0.5)):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_group(process)
            raise RuntimeError(f"the Celery worker did not start:\n{log_path.read_text()}")
    return process
