import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from benchmarks.servers import gateway, gateway_env, simulator, stop_group

pytestmark = pytest.mark.processes


def _running(pid: int) -> bool:
    """Is `pid` still running? A killed child whose parent died first stays a zombie until
    init reaps it, and a zombie runs nothing."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_simulator_serves_inside_the_block_and_is_gone_after_it():
    with simulator(args=["--max-num-seqs", "2"]) as url:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            assert response.status == 200
        port = int(url.rsplit(":", 1)[1])
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)


def test_stopping_a_group_kills_a_child_that_ignores_sigterm():
    # A leader that exits on SIGTERM and a child that ignores it: only SIGKILL to the group ends
    # both.
    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import os, signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(os.getpid(), flush=True); "
        "time.sleep(60)'])\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    child = int(process.stdout.readline())  # the child is up and ignoring SIGTERM
    stop_group(process, timeout=5)
    assert process.returncode == -signal.SIGTERM
    assert _gone(child)


@pytest.mark.django_db(transaction=True)
def test_the_gateway_answers_healthz_with_production_settings_and_stops(
    test_database_url, tmp_path
):
    env = gateway_env(
        database_url=test_database_url, redis_url=settings.REDIS_URL, secret_key="x" * 50
    )
    with gateway(env=env, log_path=tmp_path / "daphne.log") as server:
        with urllib.request.urlopen(f"{server.url}/healthz", timeout=5) as response:
            assert response.status == 200
    assert server.process.returncode is not None
    assert _gone(server.process.pid)


def test_a_gateway_that_cannot_start_raises_with_its_log(tmp_path):
    env = gateway_env(
        database_url="postgres://nobody@127.0.0.1:1/none",
        redis_url=settings.REDIS_URL,
        secret_key="",
        DJANGO_SETTINGS_MODULE="no_such_settings",
    )
    with pytest.raises(RuntimeError, match="daphne exited"):
        with gateway(env=env, log_path=tmp_path / "daphne.log", start_timeout=30):
            pass
