"""The processes a benchmark starts: the vLLM simulator and the gateway under daphne.

Each runs in its own process group on a loopback port and is stopped with everything it
started when the `with` block ends, whatever happens inside it. No Django here: the
engine benchmark runs without settings.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from core.processes import free_port, stop_group

REPO = Path(__file__).resolve().parents[1]
# The simulator prints this once its port is open; with --port 0 it is the only way to learn the
# port.
READY = re.compile(r"simulator ready on [\w.\-:]+:(\d+) ")


def log_tail(path: Path, *, lines: int = 30) -> str:
    """The last lines of a log file, for an error message; empty if it cannot be read."""
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


@contextlib.contextmanager
def simulator(
    *,
    model: str = "bench/model",
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    start_timeout: float = 30.0,
) -> Iterator[str]:
    """The vLLM simulator serving `model` on a free loopback port; yields its base URL (no /v1).

    `args` are further simulator flags (`--max-num-seqs`, `--time-to-first-token`, ...).
    Its output goes to `log_path` when given, else nowhere; either way it is read to the
    end, so a full pipe never blocks the simulator's logging of access lines.
    """
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inference_ops.simulator",
            "serve",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *args,
        ],
        cwd=REPO,
        env={**(env if env is not None else os.environ), "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: stop_group takes it whole
    )
    ports: queue.Queue[int] = queue.Queue()
    early: list[str] = []  # the first lines, for the error message if it never gets ready

    def read() -> None:
        log = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115 - closed below
        try:
            for line in process.stdout:
                if log:
                    log.write(line)
                if len(early) < 50:
                    early.append(line)
                if match := READY.search(line):
                    ports.put(int(match.group(1)))
        finally:
            if log:
                log.close()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        try:
            port = ports.get(timeout=start_timeout)
        except queue.Empty:
            raise RuntimeError(
                f"the simulator did not print its ready line within {start_timeout:.0f} s:\n"
                + "".join(early)
            ) from None
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_group(process)
        reader.join(timeout=5)


def wait_answering(
    process: subprocess.Popen, url: str, *, what: str, log_path: Path, timeout: float, step: float
) -> None:
    """Until `url` answers 200; RuntimeError with the log's tail when `process` exits first or
    `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log_tail(log_path)}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{what} did not answer {url} within {timeout:.0f} s:\n{log_tail(log_path)}"
            )
        time.sleep(step)


def gateway_env(
    *,
    database_url: str,
    redis_url: str,
    secret_key: str,
    log_level: str = "WARNING",
    base: dict[str, str] | None = None,
    **extra: str,
) -> dict[str, str]:
    """The environment of a gateway started by a benchmark: production settings over plain HTTP.

    DEBUG off, as served; no TLS redirect and no secure-only cookies, because the benchmark
    talks plain HTTP on loopback. `secret_key` must be the benchmark's own when it signs
    session cookies for the gateway to accept. `extra` adds or overrides variables
    (LOCAL_VLLM_URL, KB_EMBEDDING_THREADS, ...).
    """
    env = dict(os.environ if base is None else base)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DEBUG="false",
        SECRET_KEY=secret_key,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        SECURE_SSL_REDIRECT="false",
        SESSION_COOKIE_SECURE="false",
        CSRF_COOKIE_SECURE="false",
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        LOG_LEVEL=log_level,
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class Gateway(NamedTuple):
    url: str  # http://127.0.0.1:PORT
    process: subprocess.Popen  # its pid is the daphne process, for CPU accounting
    log_path: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@contextlib.contextmanager
def gateway(
    *,
    env: dict[str, str],
    log_path: Path,
    start_timeout: float = 60.0,
    web_concurrency: int | None = None,
) -> Iterator[Gateway]:
    """The gateway (`config.asgi:application`) under daphne on a free loopback port, with `env`
    (see `gateway_env`), its output in `log_path`. Yields once /healthz answers 200.

    With `web_concurrency`, the production launcher instead (`python -m config.web`, that many
    daphne processes on one socket); the yielded process is the launcher, the root of their tree.
    """
    port = free_port()
    if web_concurrency is None:
        command = [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "config.asgi:application",
        ]
    else:
        command = [sys.executable, "-m", "config.web"]
        env = {
            **env,
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "WEB_CONCURRENCY": str(web_concurrency),
        }
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stop_group takes any child with it
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(
            process,
            f"{url}/healthz",
            what="daphne",
            log_path=log_path,
            timeout=start_timeout,
            step=0.2,
        )
        yield Gateway(url=url, process=process, log_path=log_path)
    finally:
        stop_group(process)
