"""No engine left behind, none mistaken for ours: a stop at any moment stops what was started, an
owner killed outright takes its engine with it, what a dead owner left is stopped at the next
start, and a port held by a process the gateway did not start is reported and never routed to.

Real processes (the simulator as the engine, slow to open its port with --startup-duration),
real signals; each check of "no process left" waits a bounded time for the process to go."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import psutil
import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import AnonymousUser

from chat.openai_api.replies import pipeline_error_reply
from core.processes import ENGINE_OWNER, free_port, session_members, stop_session
from inference_ops import engine_processes, supervisor
from inference_ops.exceptions import EngineStartRefused, SupervisorError
from inference_ops.models import EngineProcess
from tests.inference_ops.simulator_process import REPO, launch_simulator
from tests.support import engines
from tests.support.answers import ask
from tests.support.factories import rule
from tests.support.polling import wait_until

pytestmark = pytest.mark.processes
transactional = pytest.mark.django_db(transaction=True)


def make_engine(name="own-sim", *, startup=0.0, **fields):
    return engines.make_engine(
        name,
        startup_timeout=90,
        stop_timeout=3,
        extra_args=["--startup-duration", str(startup), "--time-to-first-token", "5"],
        **fields,
    )


def tagged(engine) -> list[psutil.Process]:
    return engine_processes.leftovers(engine)


def none_left(engine, timeout=30) -> bool:
    return bool(wait_until(lambda: not tagged(engine), timeout=timeout, step=0.2))


def sleeper() -> subprocess.Popen:
    """A stand-in owner (a `make run`), in a session of its own."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )


def start_in_background(engine) -> tuple[threading.Thread, list]:
    outcome: list = []

    def start():
        from django.db import connection

        try:
            outcome.append(supervisor.engine_start(engine_id=engine.pk).status)
        except SupervisorError as exc:
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    return thread, outcome


def launched(engine) -> EngineProcess | None:
    """The row once its process is running (still starting)."""
    row = EngineProcess.objects.get(pk=engine.pk)
    return row if engine_processes.is_ours(row, row.pid) else None


@pytest.fixture(autouse=True)
def stop_what_is_left(request):
    yield
    if request.node.get_closest_marker("django_db") is None:
        return
    for engine in EngineProcess.objects.all():
        for process in tagged(engine):
            process.kill()


# --- the launcher's watchdog, alone ---------------------------------------------------------------


def test_the_watchdog_stops_the_engine_and_its_children_when_the_owner_is_killed(tmp_path):
    """The owner SIGKILLed runs no handler; the engine's session goes anyway, a child that
    ignores SIGTERM (as a busy EngineCore may) killed after the grace."""
    owner = sleeper()
    child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    script = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(600)"
    )
    log = tmp_path / "engine.log"
    engine_pid = None
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "inference_ops.launch",
                "--owner",
                str(owner.pid),
                "--grace",
                "1",
                str(log),
                "--",
                sys.executable,
                "-c",
                script,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
        engine_pid = int(result.stdout)
        assert wait_until(lambda: len(session_members(engine_pid)) == 2), "the child never came"
        members = session_members(engine_pid)

        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        gone = wait_until(
            lambda: not any(p.is_running() and p.status() != "zombie" for p in members),
            timeout=30,
            step=0.2,
        )
        assert gone, [p.cmdline() for p in members if p.is_running()]
        assert "the owner process" in log.read_text()
    finally:
        owner.kill()
        owner.wait(10)
        if engine_pid:
            stop_session(engine_pid, grace=0)


def test_the_launcher_refuses_an_owner_that_is_already_gone(tmp_path):
    owner = sleeper()
    owner.kill()
    owner.wait(10)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "inference_ops.launch",
            "--owner",
            str(owner.pid),
            str(tmp_path / "engine.log"),
            "--",
            "sleep",
            "600",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1 and "is gone" in result.stderr
    assert not (tmp_path / "engine.log").exists()


def test_the_watchdog_leaves_with_the_engine(tmp_path):
    owner = sleeper()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "inference_ops.launch",
                "--owner",
                str(owner.pid),
                str(tmp_path / "engine.log"),
                "--",
                "sleep",
                "1",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr

        def watchdogs():
            return [
                p
                for p in psutil.process_iter(["cmdline"])
                if "inference_ops.launch" in (p.info["cmdline"] or [])
                and str(owner.pid) in (p.info["cmdline"] or [])
                and p.status() != "zombie"
            ]

        assert wait_until(lambda: not watchdogs(), timeout=30), watchdogs()
        assert owner.poll() is None  # the owner is never touched
    finally:
        owner.kill()
        owner.wait(10)


# --- a stop at any moment -------------------------------------------------------------------------


@transactional
def test_a_stop_while_the_engine_is_starting_leaves_no_process():
    engine = make_engine(startup=60)
    thread, outcome = start_in_background(engine)
    assert wait_until(lambda: launched(engine), timeout=30), "the engine never launched"
    assert tagged(engine)

    stopped = supervisor.engine_stop(engine_id=engine.pk, reason="make run stopped")
    assert stopped.status == "stopped"
    assert none_left(engine), [p.cmdline() for p in tagged(engine)]
    thread.join(30)
    assert isinstance(outcome[0], SupervisorError) and "start cancelled" in str(outcome[0])
    # The cancelled start wrote nothing over the stop.
    row = EngineProcess.objects.get(pk=engine.pk)
    assert (row.status, row.status_reason, row.pid) == ("stopped", "make run stopped", None)


@transactional
@pytest.mark.parametrize("moment", ["while starting", "after ready"])
def test_an_engine_dies_with_its_owner_killed_outright(moment, monkeypatch):
    owner = sleeper()
    monkeypatch.setenv(ENGINE_OWNER, str(owner.pid))
    try:
        if moment == "while starting":
            engine = make_engine(startup=60)
            thread, outcome = start_in_background(engine)
            assert wait_until(lambda: launched(engine), timeout=30)
        else:
            engine = supervisor.engine_start(engine_id=make_engine().pk)
            assert engine.status == "ready"
        assert tagged(engine)

        os.kill(owner.pid, signal.SIGKILL)
        assert none_left(engine), [p.cmdline() for p in tagged(engine)]
        if moment == "while starting":
            thread.join(30)
            assert "exited during start-up" in str(outcome[0])
    finally:
        owner.kill()
        owner.wait(10)


# --- what a dead owner left, found at the next start ----------------------------------------------


@transactional
def test_an_engine_whose_owner_died_is_replaced_at_the_next_start_not_adopted(monkeypatch):
    owner = sleeper()
    monkeypatch.setenv(ENGINE_OWNER, str(owner.pid))
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    first = tagged(engine)
    # Its watchdog gone too (killed with the owner's whole tree, say): the engine lives on.
    for process in first:
        if "inference_ops.launch" in " ".join(process.cmdline()):
            process.kill()
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(10)
    assert engine_processes.process_alive(engine.pid)

    monkeypatch.delenv(ENGINE_OWNER)
    again = supervisor.engine_start(engine_id=engine.pk, reason="started by make run")
    assert again.status == "ready" and again.pid != engine.pid
    assert wait_until(lambda: not engine_processes.process_alive(engine.pid), timeout=10)
    assert [p.pid for p in tagged(again)] == [again.pid]


@transactional
def test_an_engine_the_row_lost_track_of_is_found_by_its_tag_and_stopped():
    """A worker gone mid-start leaves a running engine the row does not know: the next start
    stops it instead of refusing its own port as taken."""
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    EngineProcess.objects.filter(pk=engine.pk).update(status="crashed", pid=None)

    again = supervisor.engine_start(engine_id=engine.pk)
    assert again.status == "ready" and again.pid != engine.pid
    assert not engine_processes.process_alive(engine.pid)
    assert [p.pid for p in tagged(again)] == [again.pid]


# A session whose leader is gone, as a CI runner's is when its leader sits outside the container's
# PID namespace (sid 0): in it an untagged process (the runner), a tagged one (a launcher in
# flight), and the caller, which looks once the leader has gone.
CALLER = """
import json, sys, time, psutil
from core.processes import with_their_sessions
leader = psutil.Process(int(sys.argv[1]))
while leader.is_running() and leader.status() != psutil.STATUS_ZOMBIE:
    time.sleep(0.05)
found = with_their_sessions(lambda p: p.environ().get("TAGGED") == "yes")
print(json.dumps(sorted(p.pid for p in found)), flush=True)
"""
LEADER = """
import json, os, subprocess, sys
sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
untagged = subprocess.Popen(sleep, **quiet)
tagged = subprocess.Popen(sleep, env={"TAGGED": "yes"}, **quiet)
print(json.dumps([untagged.pid, tagged.pid]), flush=True)
subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())])
"""


def test_a_tagged_process_in_the_callers_session_never_brings_that_session_in():
    """Stopping an engine's leftovers must never reach whoever started the caller: a launcher in
    flight carries the engine's tag in the caller's session, whose leader may be invisible."""
    done = subprocess.run(
        [sys.executable, "-c", LEADER, CALLER],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,  # the caller holds the pipe until it has answered
        start_new_session=True,
    )
    lines = done.stdout.splitlines()
    untagged, tagged = json.loads(lines[0])
    try:
        assert json.loads(lines[1]) == [tagged], done.stderr
    finally:
        for pid in (untagged, tagged):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


# --- a port held by a process we did not start ----------------------------------------------------


@transactional
def test_a_port_held_by_another_process_is_reported_never_stopped_nor_routed_to():
    port = free_port()
    foreign = launch_simulator("serve", "acme/foreign", "--host", "127.0.0.1", "--port", str(port))
    try:
        assert wait_until(lambda: engine_processes.port_in_use("127.0.0.1", port), timeout=30)
        engine = make_engine(port=port)
        rule("default", engine.endpoint, is_default=True, use_kb_context=False)
        # The row names the stranger's pid (a pid reused after a reboot): still not ours.
        EngineProcess.objects.filter(pk=engine.pk).update(status="ready", pid=foreign.pid)

        with pytest.raises(EngineStartRefused, match="did not start") as refused:
            supervisor.engine_start(engine_id=engine.pk)
        assert f"pid {foreign.pid}" in str(refused.value)
        assert "inference_ops.simulator" in str(refused.value)
        row = EngineProcess.objects.select_related("endpoint").get(pk=engine.pk)
        assert row.status == "port_taken" and "did not start" in row.status_reason
        assert row.endpoint.status == "down" and "did not start" in row.endpoint.status_reason

        events = ask("Hello", max_tokens=3)
        assert events[-1].type == "error" and events[-1].code == "engine_port_taken", events
        assert "held by another program" in events[-1].message

        supervisor.engine_stop(engine_id=engine.pk)  # a stop finds nothing of ours to stop
        assert foreign.poll() is None
    finally:
        foreign.kill()
        foreign.wait(10)


@transactional
def test_a_stopped_engine_whose_port_another_process_holds_is_still_never_routed_to():
    """Stopping a `port_taken` engine stops nothing of the stranger's and keeps the endpoint
    unserved while the stranger holds the port; once the port is free, a check turns the row
    `stopped`, and the endpoint is an ordinary stopped engine's again."""
    port = free_port()
    foreign = launch_simulator("serve", "acme/base", "--host", "127.0.0.1", "--port", str(port))
    try:
        assert wait_until(lambda: engine_processes.port_in_use("127.0.0.1", port), timeout=30)
        engine = make_engine(port=port)  # the stranger serves the model the row names
        rule("default", engine.endpoint, is_default=True, use_kb_context=False)
        with pytest.raises(EngineStartRefused):
            supervisor.engine_start(engine_id=engine.pk)

        stopped = supervisor.engine_stop(engine_id=engine.pk)
        assert stopped.status == "port_taken" and foreign.poll() is None
        assert stopped.status_reason.startswith("stopped by an operator; port ")
        assert f"pid {foreign.pid}" in stopped.status_reason
        events = ask("Hello", max_tokens=3)
        assert events[-1].type == "error" and events[-1].code == "engine_port_taken", events
        assert not [e for e in events if e.type == "token"]  # never the stranger's answer

        assert supervisor.engine_check(engine_id=engine.pk) is None  # still held: no change
        assert EngineProcess.objects.get(pk=engine.pk).status == "port_taken"
    finally:
        foreign.kill()
        foreign.wait(10)
    assert wait_until(lambda: not engine_processes.port_in_use("127.0.0.1", port), timeout=10)
    supervisor.engine_check(engine_id=engine.pk)
    row = EngineProcess.objects.select_related("endpoint").get(pk=engine.pk)
    assert row.status == "stopped" and "free again" in row.status_reason
    assert row.desired_state == "stopped"  # a check frees the row, it starts nothing
    error = ask("Hello", max_tokens=3)[-1]
    assert error.type == "error" and error.code == "connect", error  # nobody there now


@transactional
def test_a_stopped_engine_of_ours_leaves_its_port_free_and_its_row_stopped():
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    stopped = supervisor.engine_stop(engine_id=engine.pk)
    assert (stopped.status, stopped.status_reason) == ("stopped", "stopped by an operator")
    assert not engine_processes.port_in_use("127.0.0.1", engine.port)


@transactional
def test_a_stranger_on_the_rows_pid_is_never_killed_by_the_health_checks(settings):
    """A pid the row kept across a reboot may name anyone's process: the checks find no engine
    behind the port and restart it, but never signal that process."""
    settings.ENGINE_UNHEALTHY_AFTER = 1
    settings.ENGINE_RESTART_UNHEALTHY_AFTER = 2
    stranger = sleeper()
    try:
        engine = make_engine()
        EngineProcess.objects.filter(pk=engine.pk).update(
            status="ready", pid=stranger.pid, desired_state="running"
        )
        assert supervisor.engine_check(engine_id=engine.pk) is None  # unhealthy
        assert supervisor.engine_check(engine_id=engine.pk) == "scheduled"
        assert stranger.poll() is None
        row = EngineProcess.objects.get(pk=engine.pk)
        assert row.status == "restarting" and row.pid is None
    finally:
        stranger.kill()
        stranger.wait(10)


# --- a question while the engine starts -----------------------------------------------------------


@transactional
def test_a_question_while_the_engine_starts_waits_for_it_within_its_first_token_budget():
    engine = make_engine(startup=4)
    rule("default", engine.endpoint, is_default=True, use_kb_context=False)
    thread, outcome = start_in_background(engine)
    assert wait_until(lambda: launched(engine), timeout=30)

    events = ask("Hello", max_tokens=3)
    assert events[-1].type == "done" and events[-1].road == "local", events
    thread.join(30)
    assert outcome == ["ready"]


@transactional
def test_a_question_the_starting_engine_cannot_meet_in_time_is_told_to_come_back():
    engine = make_engine(startup=60, first_token_timeout=1.0)
    rule("default", engine.endpoint, is_default=True, use_kb_context=False)
    thread, _ = start_in_background(engine)
    assert wait_until(lambda: launched(engine), timeout=30)

    error = ask("Hello", max_tokens=3)[-1]
    assert error.type == "error" and error.code == "engine_starting", error
    assert error.message.startswith("The local model is starting") and "connect" not in str(error)
    assert error.retryable and error.retry_after == 5.0
    # The socket's frame carries it as it is; /v1 says it in OpenAI's shape, with Retry-After.
    frame = error.as_dict()
    assert frame["code"] == "engine_starting" and frame["retry_after"] == 5.0
    reply = async_to_sync(pipeline_error_reply)(error, AnonymousUser())
    assert reply.status == 503 and reply.headers["Retry-After"] == "5"
    assert reply.body["error"]["code"] == "engine_starting"
    assert reply.body["error"]["message"].startswith("The local model is starting")

    supervisor.engine_stop(engine_id=engine.pk)
    thread.join(30)
    assert none_left(engine)


@transactional
def test_v1_tells_a_client_the_local_model_is_starting_with_retry_after(asgi_server, alice_key):
    engine = make_engine(startup=60, first_token_timeout=1.0)
    rule("default", engine.endpoint, is_default=True, use_kb_context=False)
    thread, _ = start_in_background(engine)
    assert wait_until(lambda: launched(engine), timeout=30)

    request = urllib.request.Request(
        f"{asgi_server}/v1/chat/completions",
        data=json.dumps(
            {"model": "auto", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        ).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {alice_key}"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "5"
    error = json.loads(refused.value.read())["error"]
    assert error["code"] == "engine_starting"
    assert error["message"].startswith("The local model is starting")

    supervisor.engine_stop(engine_id=engine.pk)
    thread.join(30)
    assert none_left(engine)
