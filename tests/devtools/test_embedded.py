"""The embedded Redis used where no Redis answers on 127.0.0.1:6379, and the embedded PostgreSQL
stopped by the benchmark session that started it."""

import os
import signal
import subprocess
import sys

import pytest
import redis

from core.processes import free_port
from devtools import embedded
from tests.support.processes import BASE_DIR

pytestmark = pytest.mark.processes


def test_an_embedded_redis_starts_serves_and_stops(tmp_path):
    port = free_port()
    assert not embedded.redis_answers("127.0.0.1", port)

    assert embedded.redis_start(port=port, data_dir=tmp_path) is True
    try:
        client = redis.Redis(port=port, socket_timeout=2)
        client.set("greeting", "hello")
        assert client.get("greeting") == b"hello"
        # A second start finds it answering and reuses it.
        assert embedded.redis_start(port=port, data_dir=tmp_path) is False
    finally:
        assert embedded.redis_stop(data_dir=tmp_path) is True
    assert not embedded.redis_answers("127.0.0.1", port)


def test_a_benchmark_session_started_by_manage_py_stops_the_postgresql_it_started(tmp_path):
    """manage.py's bootstrap puts the embedded server's URL in the environment before the command
    runs; the bench session must still know it started that server, hold it, and stop it."""
    script = (
        "import os, sys\n"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 'config.settings'\n"
        "from config.bootstrap import process_setup\n"
        "process_setup()\n"
        "import django\n"
        "django.setup()\n"
        "from benchmarks.stack import stack_session\n"
        "from devtools import embedded\n"
        "with stack_session():\n"
        "    print('running', embedded._postgres_running(), flush=True)\n"
        "print('after', embedded._postgres_running(), flush=True)\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(DEBUG="1", VAR_DIR=str(tmp_path / "var"))
    try:
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:  # a server the session failed to stop is stopped here, not left behind
        pid_file = tmp_path / "var" / "pgdata" / "postmaster.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text().split("\n", 1)[0]), signal.SIGTERM)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "running True" in done.stdout and "after False" in done.stdout, done.stdout
    assert "embedded PostgreSQL stopped" in done.stderr
