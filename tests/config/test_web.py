"""The production web command (config.web) and the warm-up of its processes (config.warmup):
real daphne processes on a real socket, real HTTP, real signals."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from core.processes import free_port
from knowledge.models import EmbeddingModel
from knowledge.services.vectors import embedding_model_ensure
from tests.support.processes import http_get

pytestmark = pytest.mark.processes


@pytest.fixture
def staff_cookie(django_user_model) -> str:
    """A staff session's cookie: /readyz shows each check's detail to staff only."""
    from django.test import Client

    client = Client()
    client.force_login(
        django_user_model.objects.create_user("ops", password="pw-ops-123456", is_staff=True)
    )
    return f"sessionid={client.cookies['sessionid'].value}"


class Web:
    def __init__(self, launcher: subprocess.Popen, port: int, log_path: Path):
        self.launcher, self.port, self.log_path = launcher, port, log_path
        self.url = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_once_it_says(self, line: str, timeout: float = 10.0) -> str:
        """The log once `line` is in it, or as it is after `timeout`: daphne writes a request's
        access line after the response has left, so a client can read the log before it."""
        deadline = time.monotonic() + timeout
        while line not in (log := self.log()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return log

    def children(self) -> list[psutil.Process]:
        return psutil.Process(self.launcher.pid).children()

    def wait_for_port(self, deadline: float) -> None:
        """Until the launcher's socket takes connections (daphne need not be listening yet)."""
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                return
            if self.launcher.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the launcher did not listen:\n{self.log()}")
            time.sleep(0.05)

    def wait_until_served(self, deadline: float) -> None:
        while True:
            try:
                if http_get(f"{self.url}/healthz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            if self.launcher.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the web processes did not serve:\n{self.log()}")
            time.sleep(0.2)


@contextlib.contextmanager
def web(child_env, tmp_path, *, args=(), wait=True, **env):
    port = free_port()
    log_path = tmp_path / "web.log"
    env = {**child_env, "HOST": "127.0.0.1", "PORT": str(port), "LOG_LEVEL": "INFO", **env}
    with open(log_path, "wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "config.web", *args],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Web(launcher, port, log_path)
    try:
        if wait:
            server.wait_until_served(time.monotonic() + 120)
        yield server
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            try:
                launcher.wait(30)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


def _listening_sockets(port: int) -> set[str]:
    """Inodes of the listening TCP sockets on `port`, from /proc/net/tcp."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and int(local.split(":")[1], 16) == port:
            found.add(inode)
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = fd.readlink().name
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    return inodes


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.django_db(transaction=True)
def test_two_processes_serve_one_socket_and_sigterm_to_the_launcher_stops_them(child_env, tmp_path):
    with web(child_env, tmp_path, WEB_CONCURRENCY="2", WEB_WARMUP="false") as server:
        children = server.children()
        assert len(children) == 2
        assert all("daphne" in " ".join(child.cmdline()) for child in children)
        # One listening socket on the port, and both processes hold it.
        (listening,) = _listening_sockets(server.port)
        assert all(listening in _socket_inodes(child.pid) for child in children)

        # Each one serves: with the other stopped, every request is still answered.
        for stopped in children:
            stopped.suspend()
            try:
                for _ in range(3):
                    assert http_get(f"{server.url}/healthz")[0] == 200
            finally:
                stopped.resume()

        server.launcher.send_signal(signal.SIGTERM)
        assert server.launcher.wait(30) == 0, server.log()
    assert all(_gone(child) for child in children)
    assert "SIGTERM: stopping 2 daphne process(es)" in server.log()
    assert '"GET /healthz"' not in server.log()  # no access log unless asked
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)


@pytest.mark.django_db(transaction=True)
def test_a_process_that_dies_stops_the_others_and_the_launcher_fails(child_env, tmp_path):
    with web(child_env, tmp_path, WEB_CONCURRENCY="2", WEB_WARMUP="false") as server:
        victim, other = server.children()
        victim.kill()
        assert server.launcher.wait(30) == 1, server.log()
    assert _gone(other)
    assert f"daphne {victim.pid} exited with code -9; stopping the others" in server.log()


@pytest.mark.django_db(transaction=True)
def test_a_process_warms_up_before_it_answers_its_first_request(
    child_env, tmp_path, celery_worker, staff_cookie
):
    model = embedding_model_ensure()  # a serving model, as on any database with a KB
    with web(child_env, tmp_path, wait=False, WEB_CONCURRENCY="1") as server:
        # The launcher's socket takes connections from the start; the first request waits in it
        # until the process has warmed and listens.
        server.wait_for_port(time.monotonic() + 60)
        status, body = http_get(f"{server.url}/readyz", timeout=120, cookie=staff_cookie)
        log = server.log()
        server_children = server.children()
        assert status == 200, body
        warm = json.loads(body)["checks"]["warm"]
    assert warm["ok"] is True
    assert f"embedder {model.name} (" in warm["detail"]  # and its runtime
    steps = ("database", "cache", "rules (0)", "typo index (0 phrasings)", "event loop (", "urls")
    for step in steps:
        assert step in warm["detail"]
    assert "not warmed" not in warm["detail"]
    # What start-up loaded is out of the garbage collector's sight: no full collection walks it.
    frozen = int(re.search(r"heap \((\d+) objects frozen\)", warm["detail"]).group(1))
    assert frozen > 100_000
    # Logged once, before daphne listened: the answer came from a warm process.
    (child,) = server_children
    assert log.count("warm-up of pid") == 1
    assert log.index(f"warm-up of pid {child.pid}: database") < log.index(
        "Listening on TCP address"
    )


@pytest.mark.django_db(transaction=True)
def test_a_warm_up_step_that_fails_is_a_warning_and_the_process_serves(
    child_env, tmp_path, celery_worker, staff_cookie
):
    EmbeddingModel.objects.create(
        name=str(tmp_path / "no-such-model"),
        backend="local",
        dimensions=384,
        state=EmbeddingModel.State.SERVING,
    )
    with web(child_env, tmp_path, WEB_CONCURRENCY="1") as server:
        status, body = http_get(f"{server.url}/readyz", cookie=staff_cookie)
        log = server.log()
    assert "WARNING config.warmup: warm-up of pid " in log
    assert ": embedder failed (EmbeddingError: local embedding model" in log
    assert status == 200, body
    warm = json.loads(body)["checks"]["warm"]
    assert warm["ok"] is True
    assert "not warmed, loads on first use: embedder: EmbeddingError" in warm["detail"]
    assert "rules (0)" in warm["detail"]


@pytest.mark.django_db(transaction=True)
def test_warm_up_off_leaves_loading_to_the_first_request(
    child_env, tmp_path, celery_worker, staff_cookie
):
    embedding_model_ensure()
    with web(
        child_env, tmp_path, WEB_CONCURRENCY="1", WEB_WARMUP="false", WEB_ACCESS_LOG="true"
    ) as server:
        status, body = http_get(f"{server.url}/readyz", cookie=staff_cookie)
        log = server.log_once_it_says('"GET /readyz" 200')
    assert status == 200, body
    assert json.loads(body)["checks"]["warm"]["detail"] == "off (WEB_WARMUP)"
    assert "warm-up" not in log
    assert '"GET /readyz" 200' in log  # the access log, asked for


@pytest.mark.django_db(transaction=True)
def test_a_launcher_killed_outright_leaves_no_process_serving(child_env, tmp_path):
    with web(child_env, tmp_path, WEB_CONCURRENCY="2", WEB_WARMUP="false") as server:
        children = server.children()
        server.launcher.kill()
        server.launcher.wait(10)
        deadline = time.monotonic() + 30
        while not all(_gone(child) for child in children) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert all(_gone(child) for child in children)


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        (
            {"WEB_CONCURRENCY": "0"},
            (),
            "Environment variable WEB_CONCURRENCY must be at least 1; got '0'.",
        ),
        (
            {"WEB_ACCESS_LOG": "sometimes"},
            (),
            "Environment variable WEB_ACCESS_LOG must be a boolean",
        ),
        (
            {"HOST": "::"},
            (),
            "Environment variable HOST must be an IPv4 address or a name with one; got '::'.",
        ),
        ({}, ("-p", "9000"), "HOST and PORT choose the socket"),
    ],
)
def test_a_bad_setting_stops_the_launcher_before_it_starts_anything(env, args, message):
    result = subprocess.run(
        [sys.executable, "-m", "config.web", *args],
        cwd=settings.BASE_DIR,
        env={"PATH": "/usr/bin:/bin", "PORT": str(free_port()), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"Configuration error: {message}" in result.stderr
