"""`make run`'s runner, end to end: real daphne, a real worker and beat, then a clean stop."""

import os
import signal
import subprocess
import sys
import threading
import time

import openai
import psutil
import pytest

from config.settings import BASE_DIR
from core.processes import ENGINE_OWNER, free_port, with_their_sessions
from devtools import devserver
from inference_ops.engine_processes import ENGINE_TAG, port_in_use
from tests.support.polling import wait_until
from tests.support.processes import http_get

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_the_runner_serves_the_product_and_stops_every_process_it_started(child_env, tmp_path):
    port = free_port()
    engine_port = free_port()
    env = {
        **child_env,
        "PORT": str(port),
        "VAR_DIR": str(tmp_path),
        "DEBUG": "true",
        "LOG_LEVEL": "INFO",
        "VLLM_ENGINE_PORT": str(engine_port),
        "LOCAL_ENGINE": "vllm",
        "VLLM_EXECUTABLE": "project",
    }
    runner = subprocess.Popen(
        [sys.executable, "-m", "devtools.devserver"],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read():
        for line in runner.stdout:
            lines.append(line)
            if "ready in" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(120), "".join(lines)
        # The demo's local road: the real vLLM (installed and its model converted by `make test`
        # before the suite) starts too; its first start compiles the model.
        deadline = time.monotonic() + 600
        while (
            not any("local engine local-vllm ready" in line for line in lines)
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert any("local engine local-vllm ready" in line for line in lines), "".join(lines)
        engine_pid = next(
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if "vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or [])
            and str(engine_port) in (p.info["cmdline"] or [])
        )
        descendants = psutil.Process(runner.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in descendants)
        assert "config.web" in names and "worker" in names and "beat" in names
        # WEB_CONCURRENCY's default: a daphne process per core, on the one port.
        daphnes = [p for p in descendants if "daphne" in " ".join(p.cmdline())]
        assert len(daphnes) == os.cpu_count()

        assert "admin login: admin / " in "".join(lines)
        base = f"http://127.0.0.1:{port}"
        status, body = http_get(f"{base}/readyz")
        assert status == 200, body
        status, body = http_get(f"{base}/admin/login/")
        assert status == 200 and b'name="username"' in body
        status, _ = http_get(f"{base}/static/admin/css/base.css")
        assert status == 200
        # The local model answers through the gateway `make run` serves: the real vLLM's own words.
        from django.contrib.auth import get_user_model

        from chat.apikeys import apikey_create

        user = get_user_model().objects.create_user("devserver-user")
        key = apikey_create(user=user, name="devserver", scopes=["chat"])[1]
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
        raw = client.chat.completions.with_raw_response.create(
            model="local",
            max_tokens=16,
            temperature=0,
            messages=[
                {"role": "user", "content": "What is the largest planet in the solar system?"}
            ],
        )
        assert raw.headers["X-Route"] == "local" and raw.parse().choices[0].message.content.strip()
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(60)
    assert runner.returncode == 0, "".join(lines)
    time.sleep(0.2)
    assert [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    assert (
        not psutil.pid_exists(engine_pid)
        or psutil.Process(engine_pid).status() == psutil.STATUS_ZOMBIE
    )
    assert "local engine stopped" in "".join(lines)
    assert "stopped" in lines[-1]


# A stand-in for vLLM that is as slow to open its port as the real one on a CPU, with a child that
# ignores SIGTERM (as vLLM's EngineCore may, busy compiling): the simulator, through a script
# given as VLLM_EXECUTABLE.
SLOW_VLLM = """#!/bin/sh
"{python}" -c 'import signal as s, time; s.signal(s.SIGTERM, s.SIG_IGN); time.sleep(600)' &
exec "{python}" -m inference_ops.simulator "$@" --startup-duration 300
"""


def _engine_processes(owner: int) -> list[psutil.Process]:
    """The processes of the engines started for `owner` (a `make run`): those with the tags, and
    the members of their sessions (vLLM's EngineCore overwrites its environment when it renames
    itself)."""

    def tagged(process: psutil.Process) -> bool:
        environ = process.environ()
        return bool(environ.get(ENGINE_TAG)) and environ.get(ENGINE_OWNER) == str(owner)

    return with_their_sessions(tagged)


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.Error:
            continue
    return alive


def _runner(env: dict[str, str]) -> tuple[subprocess.Popen, list[str]]:
    runner = subprocess.Popen(
        [sys.executable, "-m", "devtools.devserver"],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(runner.stdout), daemon=True).start()
    return runner, lines


def _slow_vllm(tmp_path) -> str:
    script = tmp_path / "slow-vllm"
    script.write_text(SLOW_VLLM.format(python=sys.executable))
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    "vllm",
    [
        "stand-in",
        # vLLM's API server and its EngineCore, loading the model (`make engines` built it).
        pytest.param("real", marks=pytest.mark.engines),
    ],
)
@pytest.mark.parametrize("stop", ["one SIGTERM", "SIGTERM then SIGKILL 5 s later"])
def test_a_stop_while_the_local_engine_starts_leaves_no_engine_process(
    stop, vllm, child_env, tmp_path
):
    env = {
        **child_env,
        "PORT": str(free_port()),
        "VAR_DIR": str(tmp_path),
        "DEBUG": "true",
        "VLLM_ENGINE_PORT": str(free_port()),
        "LOCAL_ENGINE": "vllm",
        "VLLM_EXECUTABLE": _slow_vllm(tmp_path) if vllm == "stand-in" else "project",
    }
    runner, lines = _runner(env)
    engine: list[psutil.Process] = []
    descendants: list[psutil.Process] = []
    try:
        # The engine's server and its child, still starting (its port not open yet): the real
        # vLLM once its EngineCore is up (loading the model).
        child = "sleep(600)" if vllm == "stand-in" else "EngineCore"

        def started() -> list[psutil.Process]:
            found = _engine_processes(runner.pid)
            names = " ".join(" ".join(p.cmdline()) for p in _alive(found))
            return found if child in names else []

        engine = wait_until(started, timeout=240, step=0.3) or []
        assert engine, "".join(lines)
        assert not port_in_use("127.0.0.1", int(env["VLLM_ENGINE_PORT"]))  # still starting
        assert any("starting the local engine local-vllm" in line for line in lines)
        descendants = psutil.Process(runner.pid).children(recursive=True)

        runner.send_signal(signal.SIGTERM)
        if stop == "one SIGTERM":
            runner.wait(90)
            assert runner.returncode == 0, "".join(lines)
            assert "local engine stopped" in "".join(lines)
        else:
            time.sleep(5)
            runner.kill()
            runner.wait(10)
        # The engine's stop timeout (15 s) for the child that ignores SIGTERM, then its SIGKILL.
        gone = wait_until(lambda: not _alive(engine + _engine_processes(runner.pid)), timeout=60)
        assert gone, [p.cmdline() for p in _alive(engine)]
        assert wait_until(lambda: not _alive(descendants), timeout=60), [
            p.cmdline() for p in _alive(descendants)
        ]
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(10)
        for process in _alive(engine + descendants + _engine_processes(runner.pid)):
            process.kill()


def test_a_port_held_by_another_process_is_reported_and_that_process_left_alone(
    child_env, tmp_path
):
    port = free_port()
    stranger = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        **child_env,
        "PORT": str(free_port()),
        "VAR_DIR": str(tmp_path),
        "DEBUG": "true",
        "VLLM_ENGINE_PORT": str(port),
        "LOCAL_ENGINE": "vllm",
        "VLLM_EXECUTABLE": _slow_vllm(tmp_path),
    }
    runner = None
    try:
        assert wait_until(lambda: port_in_use("127.0.0.1", port))
        runner, lines = _runner(env)
        said = wait_until(
            lambda: next((line for line in lines if "local engine not started" in line), None),
            timeout=120,
            step=0.3,
        )
        assert said, "".join(lines)
        assert f"port {port} is held by a process the gateway did not start" in said
        assert f"pid {stranger.pid}" in said and "http.server" in said
        assert not _engine_processes(runner.pid)
        runner.send_signal(signal.SIGTERM)
        runner.wait(90)
        assert runner.returncode == 0, "".join(lines)
        assert stranger.poll() is None  # not ours: never signalled
    finally:
        if runner is not None and runner.poll() is None:
            runner.kill()
            runner.wait(10)
        stranger.kill()
        stranger.wait(10)


def test_the_log_pump_labels_every_line_and_passes_the_bytes_through():
    # A real child and a real pipe: two lines in one write (one not UTF-8, one with CRLF), then a
    # last line without its newline, written after a pause.
    script = (
        "import os, time; os.write(1, b'one\\ntwo \\xff\\r\\n'); time.sleep(0.1); "
        "os.write(1, b'thr'); os.write(1, b'ee\\nno end')"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    written: list[bytes] = []
    devserver._pump("web", child.stdout, write=written.append)
    child.wait(10)
    assert b"".join(written) == b"web   | one\nweb   | two \xff\r\nweb   | three\nweb   | no end\n"
    # Each write carries whole lines: another pump's output never lands inside one.
    assert all(chunk.endswith(b"\n") for chunk in written)
