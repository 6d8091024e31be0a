"""Engines that die or hang under a real supervisor: Celery worker and beat, the simulator as the
engine, the answer pipeline in front. What a user sees, and how long until the engine serves
again."""

import asyncio
import os
import signal
import subprocess
import time
from datetime import timedelta

import psutil
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.utils import timezone

from chat.models import Message
from chat.turn_request import TurnRequest
from chat.turns import run_turn
from core.processes import stop_group as stop_process_group
from devtools.workers import beat_command, worker_start
from inference_ops import engine_processes, supervisor
from inference_ops.models import EngineEvent, EngineProcess
from inference_ops.tasks import engine_start_task
from routing import breaker, pipeline
from routing.events import RouteRequest
from tests.support.answers import ask
from tests.support.engines import (  # noqa: F401
    check_until,
    make_engine,
    processes_on,
    stop_engines_afterwards,
)
from tests.support.factories import endpoint, rule
from tests.support.polling import wait_until
from tests.support.processes import BASE_DIR

pytestmark = pytest.mark.processes

# --- a start task that died -----------------------------------------------------------------------


@pytest.mark.django_db
def test_an_engine_left_starting_by_a_lost_start_task_is_adopted_once_it_answers(settings):
    settings.ENGINE_START_GRACE = 1
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    # What a start task killed with its worker leaves behind: the row `starting`, the engine
    # running.
    EngineProcess.objects.filter(pk=engine.pk).update(
        status="starting",
        startup_timeout=1,
        status_changed_at=timezone.now() - timedelta(seconds=5),
    )
    assert supervisor.engine_check(engine_id=engine.pk) is None
    current = EngineProcess.objects.get(pk=engine.pk)
    assert current.status == "ready" and current.pid == engine.pid
    assert "start task was lost" in current.status_reason
    assert len(processes_on(engine.port)) == 1


@pytest.mark.django_db
def test_an_engine_left_starting_that_never_answers_is_killed_and_restarted(settings):
    settings.ENGINE_START_GRACE = 1
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    os.kill(engine.pid, signal.SIGSTOP)  # alive, never ready
    EngineProcess.objects.filter(pk=engine.pk).update(
        status="starting",
        startup_timeout=1,
        status_changed_at=timezone.now() - timedelta(seconds=5),
    )
    supervisor.engine_check(engine_id=engine.pk)
    current = EngineProcess.objects.get(pk=engine.pk)
    assert current.status == "restarting" and "start-up never finished" in current.status_reason
    assert not engine_processes.process_alive(engine.pid)
    EngineProcess.objects.filter(pk=engine.pk).update(startup_timeout=30)
    restarted = check_until(engine, "ready")
    assert restarted and restarted.pid != engine.pid


# --- a SIGKILL mid-stream, under the real worker and beat -----------------------------------------


@pytest.fixture
def celery_beat(child_env, tmp_path):
    """Celery beat with the production schedule: engine checks every ENGINE_CHECK_INTERVAL."""
    with open(tmp_path / "beat.log", "wb") as log:
        process = subprocess.Popen(
            beat_command(schedule=str(tmp_path / "schedule")),
            cwd=BASE_DIR,
            env=child_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    yield process
    stop_process_group(process)


async def _stream_until_killed(engine: EngineProcess, user) -> tuple[list, float, object]:
    """A chat turn streaming a long answer; SIGKILL the engine after the first tokens; what the
    user saw, and when."""
    events, killed_at, killed_wall = [], None, None
    async for event in run_turn(
        TurnRequest(user=user, content="tell me a long story", max_tokens=400)
    ):
        events.append(event)
        if sum(e.type == "token" for e in events) == 1 and killed_at is None:
            killed_at = time.monotonic()
            os.kill(engine.pid, signal.SIGKILL)
            killed_wall = timezone.now()
    return events, killed_at, killed_wall


@pytest.fixture(params=["simulator", "cpu", "vllm"])
def engine_row(request) -> EngineProcess:
    """The simulator, the CPU engine and the real vLLM, each with its real model
    (as under `make run`)."""
    if request.param == "simulator":
        return make_engine(extra_args=["--time-to-first-token", "5", "--inter-token-latency", "20"])
    if request.param == "vllm":
        from tests.inference_ops.test_engine_contract import BASE

        # Installed and converted by `make test` before the suite (`manage.py vllm_engine_build`).
        engine = make_engine(
            kind="vllm",
            model=BASE,
            max_num_seqs=4,
            max_model_len=1024,
            startup_timeout=600,
            stop_timeout=15,
            extra_args=["--kv-cache-memory-bytes", str(256 * 1024 * 1024)],
        )
        type(engine.endpoint).objects.filter(pk=engine.endpoint.pk).update(model=BASE)
        engine.endpoint.refresh_from_db()
        return engine
    from inference_ops import cpu_engine
    from tests.inference_ops.test_cpu_engine import make_cpu_engine

    cpu_engine.ensure_llama_server()  # built once into the cache (minutes), found there afterwards
    cpu_engine.ensure_model()
    return make_cpu_engine(name="local-sim", extra_args=["--seed", "1"])


@pytest.mark.django_db(transaction=True)
# The real vLLM starts twice here (before the kill and after it): 75 s each on a CPU with VNNI,
# about twice that without (2026-12-03), past the suite's 300 s default; the engine's own
# start-up timeout (600 s) still bounds each start.
@pytest.mark.timeout(900)
def test_a_sigkilled_engine_serves_again_soon_after_its_restart(
    engine_row, celery_worker, celery_beat, external_sim, capsys, django_user_model
):
    engine = engine_row
    EngineProcess.objects.filter(pk=engine.pk).update(desired_state="running")
    # No same-target retries: what is shown here is the fallback while the engine is down (a
    # retry's backoff can outlast the simulator's 1.4 s restart, and the engine answers its own).
    type(engine.endpoint).objects.filter(pk=engine.endpoint.pk).update(
        connect_timeout=1, first_token_timeout=5, idle_timeout=2, total_timeout=60, retries=0
    )
    fallback = endpoint("fallback", external_sim, kind="external")
    rule("default", engine.endpoint, fallback, is_default=True, use_kb_context=False)
    assert (
        engine_start_task.apply_async((engine.pk,), queue="ops").get(
            timeout=engine.startup_timeout + 30
        )
        == "ready"
    )
    engine.refresh_from_db()

    user = django_user_model.objects.create_user("ann", password="x")
    events, killed_at, killed_wall = async_to_sync(_stream_until_killed)(engine, user)
    # The user saw the first tokens, then an error event marked partial: no silent switch
    # mid-answer.
    assert [e.type for e in events[:3]] == ["session", "route", "token"]
    assert (
        events[-1].type == "error"
        and events[-1].partial
        and events[-1].target == engine.endpoint.name
    )
    # What they saw is stored, marked partial.
    stored = Message.objects.get(pk=events[0].message_id)
    assert stored.status == "partial" and stored.content == "".join(
        e.text for e in events if e.type == "token"
    )
    assert stored.content

    # Until the engine is back, answers come from the next target, and fast (the breaker opens).
    fallbacks, served_at = 0, None
    deadline = killed_at + (
        300 if engine.kind == "vllm" else 60
    )  # vLLM loads and warms up its model again
    while time.monotonic() < deadline:
        answered = ask("hi", max_tokens=2)
        assert answered[-1].type == "done", answered
        if answered[0].target == engine.endpoint.name:
            served_at = time.monotonic()
            break
        fallbacks += 1
        time.sleep(0.1)
    assert served_at, list(
        EngineEvent.objects.filter(engine=engine).values_list("status", "reason")
    )
    assert fallbacks > 0

    def restarted():
        """(restarting, starting, ready) events of the restart, once the last is written: the engine
        may answer a request a moment before its supervisor records it ready."""
        events = list(EngineEvent.objects.filter(engine=engine).order_by("pk"))
        restarting = next(e for e in events if e.status == "restarting")
        starting = next(e for e in events if e.status == "starting" and e.pk > restarting.pk)
        ready = next((e for e in events if e.status == "ready" and e.pk > starting.pk), None)
        return (restarting, starting, ready) if ready else None

    found = wait_until(restarted, timeout=30)
    assert found, list(EngineEvent.objects.filter(engine=engine).values_list("status", "reason"))
    restarting, starting, ready = found
    start_up = (ready.at - starting.at).total_seconds()
    noticed = (restarting.at - killed_wall).total_seconds()
    down = served_at - killed_at
    with capsys.disabled():
        print(
            f"\n{engine.kind}: SIGKILL mid-stream -> served by the engine again after "
            f"{down:.1f}s: noticed after {noticed:.1f}s, ready "
            f"{(ready.at - restarting.at).total_seconds():.1f}s later "
            f"(engine start-up {start_up:.1f}s, "
            f"check interval {settings.ENGINE_CHECK_INTERVAL:g}s, "
            f"first backoff {settings.ENGINE_BACKOFF_BASE:g}s, "
            f"{fallbacks} answers from the fallback meanwhile)"
        )
    # The failing request asks for a check at once (no beat tick to wait for), and the breaker's
    # cool-down no longer keeps a restarted engine shut: serving again within the start-up and 5 s
    # (the first restart's backoff inside them; the tests' is shorter than the default 2 s).
    assert noticed < settings.ENGINE_CHECK_INTERVAL
    assert down < start_up + 5 + settings.ENGINE_BACKOFF_BASE
    if (
        start_up + 5 < settings.ROUTING_BREAKER_COOLDOWN
    ):  # vLLM's start-up is longer than the cool-down anyway
        assert down < settings.ROUTING_BREAKER_COOLDOWN
    assert len(_listening_on(engine.port)) == 1  # one engine process for the row, never two
    # Nothing of the killed engine's session is left (vLLM's EngineCore and workers outlive their
    # API server's SIGKILL until the supervisor ends them).
    assert engine_processes.session_processes(engine.pid) == []


@pytest.mark.django_db
def test_an_engine_seen_ready_closes_its_endpoints_breaker(
    settings, django_capture_on_commit_callbacks
):
    settings.ROUTING_BREAKER_FAILURES = 1
    engine = make_engine()
    async_to_sync(breaker.failure)(engine.endpoint.name)
    assert async_to_sync(breaker.state)(engine.endpoint.name).state == "open"
    with django_capture_on_commit_callbacks(execute=True):
        supervisor.engine_start(engine_id=engine.pk)
    assert async_to_sync(breaker.state)(engine.endpoint.name).state == "closed"


# --- an engine that hangs: accepts connections, never answers -------------------------------------


def _listening_on(port: int) -> set[int]:
    return {
        c.pid
        for c in psutil.net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
    }


def _connections_to(port: int) -> int:
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


async def _ask_all(count: int, max_tokens: int = 2) -> tuple[list[list], list[float]]:
    async def one():
        started = time.monotonic()
        events = [
            event async for event in pipeline.answer(RouteRequest(text="hi", max_tokens=max_tokens))
        ]
        return events, time.monotonic() - started

    results = await asyncio.gather(*(one() for _ in range(count)))
    return [events for events, _ in results], [took for _, took in results]


async def _hung_engine_scenario(engine: EngineProcess, count: int) -> dict:
    tasks_before, connections_before = len(asyncio.all_tasks()), _connections_to(engine.port)
    first_wave = await _ask_all(count)
    second_wave = await _ask_all(count)  # the breaker is open now: no timeout paid
    await asyncio.sleep(0.2)
    return {
        "first": first_wave,
        "second": second_wave,
        "tasks": (tasks_before, len(asyncio.all_tasks())),
        "connections": (connections_before, _connections_to(engine.port)),
    }


@pytest.mark.django_db(transaction=True)
def test_a_hung_engine_times_out_every_request_falls_back_and_leaks_nothing(external_sim, settings):
    settings.ROUTING_BREAKER_FAILURES = 3
    engine = supervisor.engine_start(engine_id=make_engine().pk)
    type(engine.endpoint).objects.filter(pk=engine.endpoint.pk).update(
        connect_timeout=1, first_token_timeout=1, idle_timeout=1, total_timeout=10
    )
    fallback = endpoint("fallback", external_sim, kind="external")
    rule("default", engine.endpoint, fallback, is_default=True, use_kb_context=False)
    assert ask("hi", max_tokens=2)[0].target == engine.endpoint.name
    os.kill(engine.pid, signal.SIGSTOP)  # the kernel still accepts connections; nobody answers

    count = 8
    outcome = async_to_sync(_hung_engine_scenario)(engine, count)
    answers, took = outcome["first"]
    # Every request of the first wave waited one first-token timeout, then the fallback answered.
    assert all(events[-1].type == "done" and events[-1].target == "fallback" for events in answers)
    assert all("local-sim: timeout_first_token" in events[0].why for events in answers)
    assert max(took) < 10, (
        took
    )  # the first-token timeout, not the total one (a loaded machine adds seconds)
    answers, took = outcome["second"]
    # The breaker is open: the engine is not asked, so no timeout is paid (its reason says so).
    assert all(
        events[-1].target == "fallback" and "local-sim: circuit open" in events[0].why
        for events in answers
    )
    # Nothing left behind: no task still waiting on the engine, no connection to it kept open.
    tasks_before, tasks_after = outcome["tasks"]
    assert tasks_after <= tasks_before
    connections_before, connections_after = outcome["connections"]
    assert connections_after <= connections_before, outcome["connections"]

    # The supervisor's probes time out as well; the engine is killed and restarted, and serves
    # again.
    restarted = check_until(engine, "ready", timeout=60)
    assert restarted and restarted.pid != engine.pid
    assert EngineEvent.objects.filter(engine=engine, reason__contains="killed").exists()
    assert ask("hi", max_tokens=2)[0].target == engine.endpoint.name


async def _stream_until_frozen(engine: EngineProcess) -> tuple[list, float]:
    events, frozen_at = [], None
    async for event in pipeline.answer(RouteRequest(text="tell me a long story", max_tokens=400)):
        events.append(event)
        if event.type == "token" and frozen_at is None:
            frozen_at = time.monotonic()
            os.kill(engine.pid, signal.SIGSTOP)
    return events, time.monotonic() - frozen_at


@pytest.mark.django_db(transaction=True)
def test_an_engine_that_freezes_mid_answer_ends_it_at_the_idle_timeout(external_sim):
    engine = supervisor.engine_start(
        engine_id=make_engine(
            extra_args=["--time-to-first-token", "5", "--inter-token-latency", "20"]
        ).pk
    )
    type(engine.endpoint).objects.filter(pk=engine.endpoint.pk).update(
        connect_timeout=1, first_token_timeout=1, idle_timeout=1, total_timeout=10
    )
    rule(
        "default",
        engine.endpoint,
        endpoint("fallback", external_sim, kind="external"),
        is_default=True,
        use_kb_context=False,
    )
    events, waited = async_to_sync(_stream_until_frozen)(engine)
    # Tokens were out, so no fallback: the answer ends with a partial error after the idle timeout.
    assert events[-1].type == "error" and events[-1].code == "timeout_idle" and events[-1].partial
    assert 1 <= waited < 1 + 2


# --- the supervisor's own worker restarted --------------------------------------------------------


def _own_worker(child_env, log_path, queue: str) -> subprocess.Popen:
    """A Celery worker of this test alone (its own queue), to kill and start again."""
    try:
        return worker_start(
            hostname=f"restart-{os.getpid()}-{time.monotonic_ns()}@%h",
            env=child_env,
            log_path=log_path,
            cwd=BASE_DIR,
            queues=queue,
        )
    except RuntimeError as exc:
        pytest.fail(str(exc))


def _kill_worker(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)  # the worker and its pool children, no warm shutdown
    process.wait(10)


@pytest.mark.django_db(transaction=True)
def test_a_restarted_worker_keeps_the_engine_that_runs_and_restarts_the_one_that_died(
    child_env, tmp_path
):
    engine = make_engine(host="restart-test")
    EngineProcess.objects.filter(pk=engine.pk).update(desired_state="running")
    from inference_ops.tasks import engine_check_task

    log = tmp_path / "worker.log"
    worker = _own_worker(child_env, log, engine.queue)
    try:
        assert (
            engine_start_task.apply_async((engine.pk,), queue=engine.queue).get(timeout=60)
            == "ready"
        )
        engine.refresh_from_db()
        first = engine.pid

        # The worker dies; the engine, in its own session, serves on. A new worker's check finds
        # the process it did not start and keeps it: no second process for the row.
        _kill_worker(worker)
        assert engine_processes.process_alive(first)
        worker = _own_worker(child_env, log, engine.queue)
        assert (
            engine_check_task.apply_async((engine.pk,), queue=engine.queue).get(timeout=60) is None
        )
        engine.refresh_from_db()
        assert (engine.status, engine.pid) == ("ready", first)
        assert _listening_on(engine.port) == {first}

        # The engine dies while no worker runs: the next worker's checks restart it, once.
        _kill_worker(worker)
        os.kill(first, signal.SIGKILL)
        worker = _own_worker(child_env, log, engine.queue)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            engine_check_task.apply_async((engine.pk,), queue=engine.queue).get(timeout=60)
            engine.refresh_from_db()
            if engine.status == "ready" and engine.pid != first:
                break
            time.sleep(0.5)
        assert engine.status == "ready" and engine.pid != first, log.read_text()[-3000:]
        assert _listening_on(engine.port) == {engine.pid}
        assert (
            EngineEvent.objects.filter(engine=engine, status="starting").count() == 2
        )  # one restart
    finally:
        _kill_worker(worker)
